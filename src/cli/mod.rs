//! Command-line interface, in two stages: the argh flag structs (raw, no
//! system calls) and their validated configs, one file per command family
//! ([`run`]: the service; [`status`]: status, reboot-required;
//! [`maintenance`]: maintain, unmaintain, drain --dry-run; [`deploy`]:
//! crds, manifests, host-kubeconfig), and
//! [`dispatch`], which validates and runs the chosen subcommand on the async
//! runtime; [`args`] reads the command line and writes to stdout. Every node name a command takes is checked here first.

pub mod args;
pub mod deploy;
pub mod maintenance;
pub mod run;
pub mod status;

use std::process::ExitCode;

use argh::FromArgs;

use crate::error::{Error, Result};
use crate::runtime;

/// nodekeeper keeps Kubernetes nodes healthy through maintenance, reboots and upgrades.
#[derive(FromArgs, Debug)]
pub struct Cli {
    /// log at debug level (RUST_LOG overrides)
    #[argh(switch, short = 'v')]
    pub verbose: bool,
    /// log lines as text (default) or json: one JSON object per line with time, level, target, message, and node and object when the line is about one
    #[argh(option, default = "crate::logging::Format::Text")]
    pub log_format: crate::logging::Format,
    #[argh(subcommand)]
    pub command: Command,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum Command {
    Run(run::RunArgs),
    Status(status::StatusArgs),
    RebootRequired(status::RebootRequiredArgs),
    Maintain(maintenance::MaintainArgs),
    Unmaintain(maintenance::UnmaintainArgs),
    Drain(maintenance::DrainArgs),
    Crds(deploy::CrdsArgs),
    Manifests(deploy::ManifestsArgs),
    HostKubeconfig(deploy::HostKubeconfigArgs),
    Version(VersionArgs),
    HostExec(HostExecArgs),
    HostRun(HostRunArgs),
}

/// Run a command in the host's mount namespace (PID 1's); used by the reboot DaemonSet, which has host PID.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "host-exec")]
pub struct HostExecArgs {
    /// whose mount namespace to join (default 1, the host's init)
    #[argh(option, default = "1")]
    pub pid: u32,
    /// the command and its arguments, after --
    #[argh(positional, greedy)]
    pub argv: Vec<String>,
}

/// Start a reboot or upgrade command as the host's own process, with its result kept on the host (what the node agent runs; see effects::host_run).
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "host-run")]
pub struct HostRunArgs {
    /// enter this process's namespaces and cgroups first (1: the host's init; for an agent in a pod with host PID)
    #[argh(option)]
    pub join: Option<u32>,
    /// the command's id: one record, one run, per id
    #[argh(option)]
    pub id: String,
    /// where records are kept on the host
    #[argh(
        option,
        default = "std::path::PathBuf::from(crate::effects::host_run::DEFAULT_RECORDS)"
    )]
    pub records: std::path::PathBuf,
    /// how long the command may run before it is killed
    #[argh(option)]
    pub seconds: u64,
    /// run the command and write its result (started by host-run itself)
    #[argh(switch)]
    pub supervise: bool,
    /// the command and its arguments, after --
    #[argh(positional, greedy)]
    pub argv: Vec<String>,
}

/// Print the version.
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "version")]
pub struct VersionArgs {}

/// Node names are DNS subdomains; refusing others early beats a 404 later.
pub fn validate_node_name(name: &str) -> Result<()> {
    if crate::api::common::is_node_name(name) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{name:?} is not a valid node name (lower-case DNS subdomain)"
        )))
    }
}

/// The node a command names, which must exist. The hint is about the name
/// given (the service's own `require_node` error says to set --node or
/// NODE_NAME, which these commands do not take).
pub(crate) async fn named_node(
    client: &kube::Client,
    name: &str,
) -> Result<crate::api::node::Node> {
    crate::service::connect::require_node(client, name)
        .await
        .map_err(|e| match e {
            Error::NodeNotFound(n) => Error::Invalid(format!(
                "node {n:?} does not exist in the cluster (kubectl get nodes lists the names)"
            )),
            e => e,
        })
}

/// Run the parsed command line; the `ExitCode` is for commands whose success
/// has shades (such as `maintain --wait`).
impl Cli {
    /// The log format: `run --log-format` (where a service's flags go) or
    /// the global `--log-format`.
    pub fn log_format(&self) -> crate::logging::Format {
        match &self.command {
            Command::Run(r) => r.log_format.unwrap_or(self.log_format),
            _ => self.log_format,
        }
    }
}

pub fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Version(_) => {
            args::outln(format_args!("nodekeeper {}", env!("CARGO_PKG_VERSION")));
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            let config = run::RunConfig::from_args(args)?;
            if let Some(node) = &config.node {
                runtime::tasks_on_callers_only();
                crate::service::connect::introduce(&format!("node {node}"));
            } else {
                crate::service::connect::introduce("cluster");
            }
            let shutdown =
                runtime::shutdown_signal().map_err(Error::io("installing signal handlers"))?;
            runtime::block_on(crate::service::run(config, shutdown))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Crds(a) => {
            let yaml = if a.mutex {
                crate::api::mutex::crds_yaml()
            } else if a.constellation {
                crate::api::constellation::crds_yaml()
            } else {
                crate::api::crds_yaml()
            }?;
            args::out(format_args!("{yaml}"));
            Ok(ExitCode::SUCCESS)
        }
        Command::Manifests(args) => {
            let files = crate::deploy::render(&args.target, &args.options())?;
            match &args.out {
                Some(dir) => {
                    crate::deploy::write(dir, &files)?;
                    for f in &files {
                        eprintln!("wrote {}", dir.join(&f.path).display());
                    }
                }
                None => args::out(format_args!(
                    "{}",
                    crate::deploy::to_stdout(&args.target, &files)?
                )),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::HostKubeconfig(args) => {
            validate_node_name(&args.node)?;
            if args.hours == 0 {
                return Err(Error::Invalid("--hours must be at least 1".into()));
            }
            runtime::block_on(deploy::host_kubeconfig(args))
        }
        // Only returns if the exec failed.
        Command::HostExec(args) => Err(Error::Invalid(crate::effects::host::host_exec(
            args.pid, &args.argv,
        ))),
        Command::HostRun(args) => {
            let run = if args.supervise {
                crate::effects::host_run::supervise(
                    &args.records,
                    &args.id,
                    args.seconds,
                    &args.argv,
                )
            } else {
                crate::effects::host_run::start(
                    args.join,
                    &args.records,
                    &args.id,
                    args.seconds,
                    &args.argv,
                )
            };
            run.map(|()| ExitCode::SUCCESS).map_err(Error::Invalid)
        }
        Command::Status(args) => runtime::block_on(status::status(args)),
        Command::RebootRequired(args) => {
            validate_node_name(&args.node)?;
            runtime::block_on(status::reboot_required(args))
        }
        Command::Maintain(args) => {
            validate_node_name(&args.node)?;
            runtime::block_on(maintenance::maintain(args))
        }
        Command::Unmaintain(args) => {
            validate_node_name(&args.node)?;
            runtime::block_on(maintenance::unmaintain(args))
        }
        Command::Drain(args) => {
            if !args.dry_run {
                return Err(Error::Invalid(format!(
                    "drain only plans (--dry-run); to drain {0} use: nodekeeper maintain {0} --wait",
                    args.node
                )));
            }
            validate_node_name(&args.node)?;
            runtime::block_on(maintenance::drain_dry_run(args))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's lists that the code also has (the `run` flags, the
    /// `manifests --for` targets, the RBAC grants) are generated from the
    /// code and spliced between `<!-- generated: NAME -->` and
    /// `<!-- end: NAME -->`; this fails when they differ, and
    /// `NODEKEEPER_REGENERATE=1` rewrites them.
    #[test]
    fn checked_in_readme_tables_match_the_code() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let readme = std::fs::read_to_string(&path).unwrap_or_default();
        let tables = [
            ("run-flags", run::readme_flags_table()),
            ("manifests-targets", crate::deploy::targets_readme_table()),
            ("rbac", crate::deploy::rbac_readme_table()),
        ];
        let mut fresh = readme.clone();
        let mut stale = Vec::new();
        for (name, table) in &tables {
            let (begin, end) = (
                format!("<!-- generated: {name} -->\n"),
                format!("<!-- end: {name} -->"),
            );
            let (Some(b), Some(e)) = (fresh.find(&begin), fresh.find(&end)) else {
                stale.push(format!("{name}: markers missing"));
                continue;
            };
            let at = b + begin.len();
            if fresh[at..e] != **table {
                stale.push(name.to_string());
                fresh.replace_range(at..e, table);
            }
        }
        if std::env::var_os("NODEKEEPER_REGENERATE").is_some() {
            let _ = std::fs::write(&path, &fresh);
            return;
        }
        assert!(
            stale.is_empty(),
            "README tables out of date: {stale:?} (NODEKEEPER_REGENERATE=1 cargo test --lib checked_in)"
        );
    }

    /// Every link to a section of the README or tests/README.md names a
    /// heading there (GitHub's anchors: lowercased, punctuation dropped,
    /// spaces as `-`): sections move between the two.
    #[test]
    fn every_section_link_in_the_readmes_resolves() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
        let anchors = |text: &str| -> Vec<String> {
            text.lines()
                .filter_map(|l| {
                    l.trim_start_matches('#')
                        .strip_prefix(' ')
                        .filter(|_| l.starts_with('#'))
                })
                .map(|h| {
                    h.trim()
                        .to_lowercase()
                        .chars()
                        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
                        .map(|c| if c == ' ' { '-' } else { c })
                        .collect()
                })
                .collect()
        };
        let docs = [
            ("README.md", read("README.md")),
            ("tests/README.md", read("tests/README.md")),
        ];
        let mut broken = Vec::new();
        for (name, text) in &docs {
            for (i, _) in text.match_indices("](") {
                let link = &text[i + 2..];
                let link = &link[..link.find(')').unwrap_or(0)];
                let Some((file, anchor)) = link.split_once('#') else {
                    continue;
                };
                let target = match file {
                    "" => name,
                    f if f.ends_with("tests/README.md") => "tests/README.md",
                    f if f.ends_with("README.md") => "README.md",
                    _ => continue,
                };
                let heads = docs
                    .iter()
                    .find(|(n, _)| *n == target)
                    .map(|(_, t)| anchors(t));
                if !heads.is_some_and(|h| h.iter().any(|a| a == anchor)) {
                    broken.push(format!("{name}: {link}"));
                }
            }
        }
        assert!(broken.is_empty(), "links to no heading: {broken:#?}");
    }

    /// `manifests --help` names every target there is.
    #[test]
    fn the_manifests_help_names_every_target() {
        use argh::FromArgs;
        let help = match deploy::ManifestsArgs::from_args(&["manifests"], &["--help"]) {
            Err(argh::EarlyExit { output, .. }) => output,
            Ok(_) => String::new(),
        };
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for (t, _, _) in crate::deploy::TARGETS {
            assert!(
                flat.contains(&format!(" {t},")) || flat.contains(&format!(" {t} ")),
                "{t} missing from: {flat}"
            );
        }
    }

    #[test]
    fn a_bad_node_name_is_refused_in_one_line_naming_it() {
        assert!(validate_node_name("worker-1").is_ok());
        let err = validate_node_name("Worker_1").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("\"Worker_1\" is not a valid node name (lower-case DNS subdomain)")
        );
    }
}
