//! Reading kubeconfig files exactly as kube-client does, with the YAML
//! deserialiser built once instead of once per kubeconfig type.
//!
//! kube-client reads its `Kubeconfig` straight from YAML, which
//! monomorphises serde-saphyr's deserialiser for every type in it. Here
//! each YAML document becomes a [`super::yaml_tree`] and the types are
//! read from that, with serde-saphyr's rules (the unit tests compare both
//! readings on a corpus of odd kubeconfigs).
//!
//! Also as kube-client: `KUBECONFIG`'s files merged in order, else
//! `~/.kube/config`, else the pod's service account; relative file names
//! in a kubeconfig are relative to its folder; UTF-8 and UTF-16 byte-order
//! marks. Not carried over: kube-client's `KUBE_RS_DEBUG_*` overrides.

use std::path::Path;

use kube::Config;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The credentials `run` and the CLI use when no `--kubeconfig` is given:
/// a kubeconfig from `KUBECONFIG` or `~/.kube/config`, else the pod's
/// service account (as `kube::Config::infer`). The error is the
/// kubeconfig's: not being in a pod is the expected other half.
pub async fn infer() -> Result<Config, String> {
    let kubeconfig = match read() {
        Ok(kc) => Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e),
    };
    match kubeconfig {
        Ok(config) => Ok(config),
        Err(kubeconfig) => Config::incluster().map_err(|_| kubeconfig),
    }
}

/// The kubeconfig `KUBECONFIG` names (its files merged in order), else
/// `~/.kube/config`.
pub fn read() -> Result<Kubeconfig, String> {
    let listed = std::env::var_os("KUBECONFIG")
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if listed.is_empty() {
        let home = std::env::home_dir().ok_or("no KUBECONFIG and no home folder")?;
        return read_from(&home.join(".kube").join("config"));
    }
    listed
        .iter()
        .try_fold(Kubeconfig::default(), |merged, path| {
            merged.merge(read_from(path)?).map_err(|e| e.to_string())
        })
}

/// One kubeconfig file, its documents merged, its relative file names
/// made absolute.
pub fn read_from(path: &Path) -> Result<Kubeconfig, String> {
    let text = read_text(path)
        .map_err(|e| format!("failed to read kubeconfig from {}: {e}", path.display()))?;
    let mut merged: Option<Kubeconfig> = None;
    for mut doc in parse(&text)? {
        if let Some(dir) = path.parent() {
            absolute_files(&mut doc, dir);
        }
        merged = Some(match merged {
            Some(m) => m.merge(doc).map_err(|e| e.to_string())?,
            None => doc,
        });
    }
    Ok(merged.unwrap_or_default())
}

/// Every YAML document of `text` as a kubeconfig.
pub fn parse(text: &str) -> Result<Vec<Kubeconfig>, String> {
    let failed = |e: String| format!("failed to parse kubeconfig YAML: {e}");
    super::yaml_tree::documents(text)
        .map_err(failed)?
        .iter()
        .map(|doc| serde::Deserialize::deserialize(doc).map_err(|e| failed(e.to_string())))
        .collect()
}

/// The file's text, honouring a byte-order mark as kube-client does.
fn read_text(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind::InvalidData};
    let bytes = std::fs::read(path)?;
    let utf16 = |rest: &[u8], from: fn([u8; 2]) -> u16| {
        let units: Vec<u16> = rest.chunks_exact(2).map(|c| from([c[0], c[1]])).collect();
        String::from_utf16(&units).map_err(|_| Error::new(InvalidData, "invalid UTF-16"))
    };
    match bytes.as_slice() {
        [0xFF, 0xFE, rest @ ..] => utf16(rest, u16::from_le_bytes),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, u16::from_be_bytes),
        [0xEF, 0xBB, 0xBF, rest @ ..] => {
            String::from_utf8(rest.to_vec()).map_err(|_| Error::new(InvalidData, "invalid UTF-8"))
        }
        _ => String::from_utf8(bytes).map_err(|_| Error::new(InvalidData, "invalid UTF-8")),
    }
}

/// Relative certificate, key, token-file and exec-command names are
/// relative to the kubeconfig's folder; an exec command only when it has
/// a path separator (a bare name is looked up in `PATH`), as client-go's
/// `GetAuthInfoFileReferences`.
fn absolute_files(kc: &mut Kubeconfig, dir: &Path) {
    let absolute = |file: &mut Option<String>| {
        if let Some(f) = file.as_deref()
            && Path::new(f).is_relative()
            && let Some(abs) = dir.join(f).to_str()
        {
            *file = Some(abs.to_owned());
        }
    };
    for cluster in kc.clusters.iter_mut().filter_map(|n| n.cluster.as_mut()) {
        absolute(&mut cluster.certificate_authority);
    }
    for auth in kc
        .auth_infos
        .iter_mut()
        .filter_map(|n| n.auth_info.as_mut())
    {
        absolute(&mut auth.client_certificate);
        absolute(&mut auth.client_key);
        absolute(&mut auth.token_file);
        if let Some(exec) = auth.exec.as_mut()
            && exec
                .command
                .as_deref()
                .is_some_and(|c| c.contains(std::path::MAIN_SEPARATOR))
        {
            absolute(&mut exec.command);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ours and kube-client's reading of `yaml`, both as JSON (or the error).
    fn both(
        yaml: &str,
    ) -> (
        Result<serde_json::Value, String>,
        Result<serde_json::Value, String>,
    ) {
        let ours = parse(yaml).map(|docs| {
            let merged = docs
                .into_iter()
                .try_fold(Kubeconfig::default(), Kubeconfig::merge)
                .expect("merge");
            serde_json::to_value(merged).expect("json")
        });
        let theirs = Kubeconfig::from_yaml(yaml)
            .map(|kc| serde_json::to_value(kc).expect("json"))
            .map_err(|e| e.to_string());
        (ours, theirs)
    }

    const ODD: &[&str] = &[
        "",
        "---\n",
        "apiVersion: v1\nkind: Config\nclusters: null\nusers: ~\n",
        // Plain scalars that look like numbers, booleans and nulls.
        "users:\n- name: a\n  user:\n    token: 0123\n    username: yes\n    password: 1e3\n",
        "users:\n- name: a\n  user:\n    token: \"0123\"\n    username: 'true'\n",
        "users:\n- name: a\n  user:\n    token: 12345678901234567890123\n",
        "users:\n- name: a\n  user:\n    token: true\n",
        "clusters:\n- name: c\n  cluster:\n    server: https://h:6443\n    insecure-skip-tls-verify: true\n    certificate-authority-data: TFMwdExTMUNSVWQ=\n",
        "clusters:\n- name: c\n  cluster:\n    server: https://h:6443\n    insecure-skip-tls-verify: \"true\"\n",
        // Flow style, anchors, aliases and merge keys.
        "clusters: [{name: c, cluster: {server: 'https://h'}}]\ncurrent-context: x\n",
        "base: &b {server: https://h, proxy-url: http://p:3128}\nclusters:\n- name: c\n  cluster:\n    <<: *b\n    tls-server-name: n\n",
        "users:\n- name: a\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: ./bin/cred\n      args: [get, 1, true]\n      env:\n      - name: A\n        value: 2\n      interactiveMode: Never\n      provideClusterInfo: true\n",
        // Unknown fields, extensions and preferences kept.
        "preferences: {colors: true, extensions: [{name: e, extension: {a: [1, 2.5, null]}}]}\nfoo: {bar: 0x1F, baz: 0o17, q: -5, r: \"5\", s: !!str 5}\nblock: |\n  two\n  lines\nfolded: >-\n  one\n  line\n",
        "clusters:\n- name: c\n  cluster:\n    server: !!str https://h\n    tls-server-name: !!str ~\n",
        // Two documents merged; the first's current context wins.
        "current-context: one\ncontexts:\n- name: one\n  context: {cluster: c, user: a, namespace: 007}\n---\ncurrent-context: two\ncontexts:\n- name: two\n  context: {cluster: d, user: b}\n",
    ];

    /// Inputs both must refuse.
    const BROKEN: &[&str] = &[
        "clusters: [\n",
        "clusters: 5\n",
        "users:\n- name: a\n  user:\n    exec:\n      interactiveMode: Sometimes\n",
        "a: 1\na: 2\n",
    ];

    #[test]
    fn reads_what_kube_client_reads() {
        for yaml in ODD {
            match both(yaml) {
                (Ok(ours), Ok(theirs)) => assert_eq!(ours, theirs, "{yaml}"),
                (ours, theirs) => panic!("{yaml}\nours: {ours:?}\nkube-client: {theirs:?}"),
            }
        }
        for yaml in BROKEN {
            let (ours, theirs) = both(yaml);
            assert!(
                ours.is_err() && theirs.is_err(),
                "{yaml}\nours: {ours:?}\nkube-client: {theirs:?}"
            );
        }
    }

    #[test]
    fn relative_files_are_relative_to_the_kubeconfig() {
        let dir = std::env::temp_dir().join(format!("nk-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("config");
        let yaml = "clusters:\n- name: c\n  cluster: {server: https://h, certificate-authority: ca.crt}\nusers:\n- name: a\n  user:\n    client-key: /abs/key\n    token-file: t\n    exec: {command: bin/cred}\n- name: b\n  user:\n    exec: {command: aws}\n";
        std::fs::write(&path, yaml).expect("write");
        let ours = serde_json::to_value(read_from(&path).expect("ours")).expect("json");
        let theirs =
            serde_json::to_value(Kubeconfig::read_from(&path).expect("theirs")).expect("json");
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(ours, theirs);
        assert_eq!(
            ours["clusters"][0]["cluster"]["certificate-authority"],
            dir.join("ca.crt").to_str().expect("utf-8")
        );
        assert_eq!(ours["users"][1]["user"]["exec"]["command"], "aws");
    }

    #[test]
    fn byte_order_marks_as_kube_client() {
        let dir = std::env::temp_dir().join(format!("nk-kubeconfig-bom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let yaml = "current-context: x\n";
        let mut le = vec![0xFF, 0xFE];
        le.extend(yaml.encode_utf16().flat_map(u16::to_le_bytes));
        let mut be = vec![0xFE, 0xFF];
        be.extend(yaml.encode_utf16().flat_map(u16::to_be_bytes));
        let mut utf8 = vec![0xEF, 0xBB, 0xBF];
        utf8.extend(yaml.bytes());
        for (i, bytes) in [le, be, utf8].into_iter().enumerate() {
            let path = dir.join(format!("config-{i}"));
            std::fs::write(&path, bytes).expect("write");
            let kc = read_from(&path).expect("read");
            assert_eq!(kc.current_context.as_deref(), Some("x"), "encoding {i}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
