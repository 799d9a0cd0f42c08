//! Reboot and upgrade commands as the host's own processes, not the
//! agent's children. An upgrade can take many minutes, needs the host's
//! memory and network, and must not die when the agent's pod is rolled
//! (the once-per-boot record forbids running it again, so a killed upgrade
//! left the node half-upgraded until its deadline failed it).
//!
//! So a command is started by a short-lived `nodekeeper host-run` that, in
//! a container (`--join 1`), enters every namespace of the host's PID 1
//! but the PID and user ones, moves itself into PID 1's cgroups (out of the
//! pod's, whose memory limit and lifetime are the agent's), claims the
//! command's record on the host and starts a *supervisor* in a process
//! group of its own, then exits. The supervisor (`host-run --supervise`)
//! runs the command with its deadline, keeps the last [`TAIL`] bytes of its
//! output, and writes the result into the record. The agent polls the
//! record ([`command`]); an agent started later finds the same record by
//! the command's id and publishes its result ([`command`] again: claiming
//! is idempotent, a second claim attaches).
//!
//! Records live on the host, one directory per command under
//! `--command-records` (default [`DEFAULT_RECORDS`], a tmpfs: a record ends
//! with the boot it was made in, as the once-per-boot records on the node
//! do): `id` (the command's id, to tell hash collisions), `supervisor`
//! (`PID STARTTIME`, to tell a supervisor that died from one that runs),
//! `note` (what could not be left: a cgroup a reduced profile may not
//! leave), and `result` (written once, atomically: `exit CODE`, `signal N`,
//! `timeout SECONDS` or `error`, then the output's tail).
//!
//! Not through `systemd-run`: joining PID 1's namespaces and cgroups works
//! the same with or without systemd, and is what the test machines (no
//! systemd as PID 1) can prove; on a systemd host the command runs in PID
//! 1's cgroup (`init.scope`), outside every unit.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use smol::future::FutureExt;

use super::host::{Exec, in_root};

/// Where records are kept on the host unless `run --command-records` says.
pub const DEFAULT_RECORDS: &str = "/run/nodekeeper/commands";
/// Output kept in a record: the end of it, where a failing command says why.
pub const TAIL: usize = 16 * 1024;
/// Output kept for status and events.
const PUBLISHED: usize = 400;
/// How long the agent waits past a command's deadline for its result (the
/// supervisor kills the command at the deadline and writes at once).
const GRACE: Duration = Duration::from_secs(30);
/// How long `host-run` (joining, claiming, starting the supervisor) may take.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// The record directory's name for `id`: fixed width, no characters from
/// the id (it holds a plan's name, a version and a boot ID).
pub fn record_name(id: &str) -> String {
    format!("{:016x}", crate::decide::disrupt::fnv(id.as_bytes()))
}

/// `nodekeeper host-run`, before any thread starts (namespaces cannot be
/// changed by a multithreaded process): join `join`'s namespaces and
/// cgroups when asked, claim the record for `id` under `records` (already
/// claimed: nothing to do, the agent attaches), start the supervisor.
pub fn start(
    join: Option<u32>,
    records: &Path,
    id: &str,
    seconds: u64,
    argv: &[String],
) -> Result<(), String> {
    if argv.is_empty() {
        return Err("host-run needs a command after --".into());
    }
    if let Some(pid) = join {
        join_namespaces(pid)?;
    }
    // Out of the agent's cgroup: in a container as root, or on a host as
    // root (the systemd unit's cgroup ends with the unit). A profile that
    // may not (read-only cgroups) keeps the command where it is, and says.
    let note = match (join, rustix::process::geteuid().is_root()) {
        (Some(pid), _) => leave_cgroups(pid).err(),
        (None, true) => leave_cgroups(1).err(),
        (None, false) => None,
    };
    std::fs::create_dir_all(records).map_err(|e| format!("creating {}: {e}", records.display()))?;
    let dir = records.join(record_name(id));
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(format!("creating {}: {e}", dir.display())),
    }
    let write = |file: &str, text: &str| {
        std::fs::write(dir.join(file), text)
            .map_err(|e| format!("writing {}: {e}", dir.join(file).display()))
    };
    write("id", id)?;
    if let Some(note) = &note {
        write("note", note)?;
    }
    let mut supervisor = std::process::Command::new("/proc/self/exe");
    supervisor
        .args(["host-run", "--supervise", "--id", id, "--seconds"])
        .arg(seconds.to_string())
        .arg("--records")
        .arg(records)
        .arg("--")
        .args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut supervisor, 0);
    match supervisor.spawn() {
        Ok(child) => {
            let pid = child.id();
            let since = start_time(pid).unwrap_or_default();
            // Not waited for: it outlives this process, and the agent.
            drop(child);
            write("supervisor", &format!("{pid} {since}"))
        }
        Err(e) => {
            let why = format!("error\nstarting the supervisor: {e}");
            write_result(&dir, &why)?;
            Err(why)
        }
    }
}

/// Enter every namespace of `pid` but its PID and user ones (this
/// process's PID namespace is the host's already: the pod has host PID).
fn join_namespaces(pid: u32) -> Result<(), String> {
    use rustix::thread::LinkNameSpaceType as T;
    // Opened before any is joined: the mount namespace changes what /proc is.
    let kinds = [
        ("ipc", T::InterProcessCommunication),
        ("uts", T::HostNameAndNISDomainName),
        ("net", T::Network),
        ("cgroup", T::ControlGroup),
        ("mnt", T::Mount),
    ];
    let mut opened = Vec::new();
    for (name, kind) in kinds {
        let path = format!("/proc/{pid}/ns/{name}");
        let f = std::fs::File::open(&path).map_err(|e| {
            format!("opening {path}: {e} (needs host PID, root and CAP_SYS_PTRACE)")
        })?;
        opened.push((name, kind, f));
    }
    for (name, kind, f) in &opened {
        rustix::thread::move_into_link_name_space(std::os::fd::AsFd::as_fd(f), Some(*kind))
            .map_err(|e| {
                format!("joining the host's {name} namespace: {e} (needs CAP_SYS_ADMIN and CAP_SYS_CHROOT)")
            })?;
    }
    Ok(())
}

/// Move this process into `pid`'s cgroup in every hierarchy (v1 and v2),
/// found through this process's mount table (the host's, once joined).
fn leave_cgroups(pid: u32) -> Result<(), String> {
    let theirs = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("reading /proc/{pid}/cgroup: {e}"))?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    let mut failed = Vec::new();
    for line in theirs.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Some(mount) = cgroup_mount(&mounts, controllers) else {
            continue;
        };
        let procs = Path::new(&mount)
            .join(path.trim_start_matches('/'))
            .join("cgroup.procs");
        if let Err(e) = std::fs::write(&procs, "0") {
            failed.push(format!("{}: {e}", procs.display()));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the command stays in the agent's cgroup (its memory limit, and its end with the agent): {}",
            failed.join("; ")
        ))
    }
}

/// Where the hierarchy of `controllers` (`""` for cgroup v2, else e.g.
/// `cpu,cpuacct` or `name=systemd`) is mounted whole, per a mountinfo.
fn cgroup_mount(mountinfo: &str, controllers: &str) -> Option<String> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let (root, point) = (fields.get(3)?, fields.get(4)?);
        let mut r = right.split(' ');
        let (fstype, _source, options) = (r.next()?, r.next()?, r.next().unwrap_or_default());
        if *root != "/" {
            return None;
        }
        let wanted = match (fstype, controllers) {
            ("cgroup2", "") => true,
            ("cgroup", c) if !c.is_empty() => {
                let opts: Vec<&str> = options.split(',').collect();
                c.split(',').all(|c| opts.contains(&c))
            }
            _ => false,
        };
        wanted.then(|| point.replace("\\040", " "))
    })
}

/// `host-run --supervise`: run the command for at most `seconds`, keep the
/// end of its output, and write the result into the record.
pub fn supervise(records: &Path, id: &str, seconds: u64, argv: &[String]) -> Result<(), String> {
    let dir = records.join(record_name(id));
    let limit = Duration::from_secs(seconds.max(1));
    let result = crate::runtime::block_on(run_with_tail(argv, limit));
    write_result(&dir, &result)
}

/// The command's result in the record's format.
async fn run_with_tail(argv: &[String], limit: Duration) -> String {
    let Some((program, args)) = argv.split_first() else {
        return "error\nan empty command".into();
    };
    let (reader, writer) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return format!("error\na pipe for the output: {e}"),
    };
    let Ok(writer2) = writer.try_clone() else {
        return "error\na pipe for the output".into();
    };
    let mut command = std::process::Command::new(program);
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .stderr(writer2);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let child = smol::process::Command::from(command).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return format!("error\n{program}: {e}"),
    };
    let pgid = child.id() as i32;
    let tail = std::sync::Arc::new(std::sync::Mutex::new(Tail::default()));
    let reading = smol::unblock({
        let tail = tail.clone();
        move || read_into(reader, &tail)
    });
    let deadline = async {
        crate::runtime::sleep(limit).await;
        None
    };
    let status = async { child.status().await.ok() }.or(deadline).await;
    if status.is_none()
        && let Some(pid) = rustix::process::Pid::from_raw(pgid)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    // A daemon the command left behind may hold the pipe open: what came
    // within two seconds of the end is what the record keeps.
    let _ = crate::runtime::timeout(Duration::from_secs(2), reading).await;
    let output = tail.lock().map(|t| t.text()).unwrap_or_default();
    let head = match status {
        None => format!("timeout {}", limit.as_secs()),
        Some(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(code), _) => format!("exit {code}"),
            (None, Some(sig)) => format!("signal {sig}"),
            (None, None) => "error".into(),
        },
    };
    format!("{head}\n{output}")
}

/// The last [`TAIL`] bytes of a stream.
#[derive(Default)]
struct Tail {
    bytes: std::collections::VecDeque<u8>,
    cut: bool,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend(chunk);
        let over = self.bytes.len().saturating_sub(TAIL);
        if over > 0 {
            self.bytes.drain(..over);
            self.cut = true;
        }
    }

    fn text(&self) -> String {
        let (a, b) = self.bytes.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        if self.cut { format!("…{text}") } else { text }
    }
}

fn read_into(mut reader: std::io::PipeReader, tail: &std::sync::Mutex<Tail>) {
    let mut buf = [0u8; 8192];
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        if let Ok(mut t) = tail.lock() {
            t.push(&buf[..n]);
        }
    }
}

/// Write `result` into the record at `dir`, whole or not at all.
fn write_result(dir: &Path, result: &str) -> Result<(), String> {
    let tmp = dir.join("result.tmp");
    std::fs::write(&tmp, result).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join("result"))
        .map_err(|e| format!("writing {}: {e}", dir.join("result").display()))
}

/// When `pid` started (field 22 of /proc/PID/stat, in clock ticks since
/// boot): with the PID, it names one process, not a later one that reused
/// the PID.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    // `rest` starts at field 3 (state); field 22 is the 20th of it.
    rest.split(' ').nth(19)?.parse().ok()
}

/// What the agent finds in a record.
#[derive(Debug, PartialEq)]
enum Found {
    /// No record: the command was never started in this boot.
    Nothing,
    Running,
    Done(Result<(), String>),
    /// The supervisor is gone and wrote no result (killed, or the host ran
    /// out of memory).
    Lost(String),
}

fn look(dir: &Path, id: &str) -> Result<Found, String> {
    match std::fs::read_to_string(dir.join("id")) {
        Ok(text) if text == id => {}
        Ok(other) => {
            return Err(format!(
                "{} holds another command's record ({other:?})",
                dir.display()
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(if dir.exists() {
                Found::Running
            } else {
                Found::Nothing
            });
        }
        Err(e) => return Err(format!("reading {}: {e}", dir.join("id").display())),
    }
    let read_result = || std::fs::read_to_string(dir.join("result")).ok();
    if let Some(result) = read_result() {
        return Ok(Found::Done(parse_result(&result)));
    }
    let supervisor = std::fs::read_to_string(dir.join("supervisor")).unwrap_or_default();
    let mut it = supervisor.split_whitespace();
    let pid: Option<u32> = it.next().and_then(|p| p.parse().ok());
    let since: Option<u64> = it.next().and_then(|s| s.parse().ok());
    let alive = match (pid, since) {
        (Some(pid), Some(since)) => start_time(pid) == Some(since),
        // Being started (the supervisor's line is written right after).
        _ => return Ok(Found::Running),
    };
    if alive {
        return Ok(Found::Running);
    }
    // It may have written its result just before it ended.
    Ok(match read_result() {
        Some(result) => Found::Done(parse_result(&result)),
        None => Found::Lost(format!(
            "the command's supervisor (process {}) ended without a result",
            pid.unwrap_or_default()
        )),
    })
}

/// A record's result: `Ok` for exit 0, else what went wrong and the end
/// of the output, cut to what status and events hold.
fn parse_result(text: &str) -> Result<(), String> {
    let (head, output) = text.split_once('\n').unwrap_or((text, ""));
    let output = last_chars(output.trim(), PUBLISHED);
    let why = match head.split_once(' ') {
        Some(("exit", "0")) => return Ok(()),
        Some(("exit", code)) => format!("exited with {code}"),
        Some(("signal", sig)) => format!("killed by signal {sig}"),
        Some(("timeout", secs)) => format!("still running after {secs} s; killed"),
        _ => "could not run".to_string(),
    };
    Err(if output.is_empty() {
        why
    } else {
        format!("{why}: {output}")
    })
}

fn last_chars(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut cut = s.len() - n;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("…{}", &s[cut..])
}

/// Where the agent reads `records`: through PID 1's root in a container.
fn seen_from_agent(records: &Path, exec: Exec) -> PathBuf {
    match exec {
        Exec::Direct => records.to_path_buf(),
        Exec::HostNamespace => in_root(Path::new("/proc/1/root"), records),
    }
}

/// Run the host command `id` (start it, or attach to the one a previous
/// agent started in this boot) and wait for its result: `Ok` when it
/// exited 0, else why not, with the end of its output.
pub async fn command(
    id: &str,
    argv: &[String],
    limit: Duration,
    exec: Exec,
    records: &Path,
) -> Result<(), String> {
    let dir = seen_from_agent(records, exec).join(record_name(id));
    let look_now = || {
        let (dir, id) = (dir.clone(), id.to_string());
        super::host::bounded(move || look(&dir, &id))
    };
    if look_now().await? == Found::Nothing {
        let me = super::host::SELF_EXE.to_string();
        let mut start = vec![me, "host-run".into()];
        if exec == Exec::HostNamespace {
            start.extend(["--join".into(), "1".into()]);
        }
        start.extend([
            "--id".into(),
            id.into(),
            "--seconds".into(),
            limit.as_secs().max(1).to_string(),
            "--records".into(),
            records.display().to_string(),
            "--".into(),
        ]);
        start.extend(argv.iter().cloned());
        match super::host::run_for(&start, START_DEADLINE).await? {
            (0, _) => {}
            (code, out) => return Err(format!("starting {}: exit {code}: {out}", argv[0])),
        }
    } else {
        log::info!(
            "host command {:?} was started earlier in this boot: waiting for its result",
            argv.join(" ")
        );
    }
    let give_up = std::time::Instant::now() + limit + GRACE;
    let mut every = Duration::from_millis(200);
    loop {
        match look_now().await? {
            Found::Done(result) => return result,
            Found::Lost(why) => return Err(why),
            Found::Nothing => return Err(format!("{}: the record is gone", dir.display())),
            Found::Running if std::time::Instant::now() > give_up => {
                return Err(format!(
                    "no result within {} s of its deadline",
                    GRACE.as_secs()
                ));
            }
            Found::Running => {}
        }
        crate::runtime::sleep(every).await;
        every = (every * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_read_as_the_record_says() {
        assert_eq!(parse_result("exit 0\nfine"), Ok(()));
        assert_eq!(
            parse_result("exit 3\nno space left"),
            Err("exited with 3: no space left".into())
        );
        assert_eq!(parse_result("signal 9\n"), Err("killed by signal 9".into()));
        assert_eq!(
            parse_result("timeout 60\nstill copying"),
            Err("still running after 60 s; killed: still copying".into())
        );
        let long = format!("exit 1\n{}END", "x".repeat(5000));
        let Err(why) = parse_result(&long) else {
            panic!("a failure")
        };
        assert!(why.ends_with("END") && why.len() < 450, "{why}");
    }

    #[test]
    fn the_tail_keeps_the_end() {
        let mut t = Tail::default();
        t.push(&vec![b'a'; TAIL]);
        t.push(b"the end");
        let text = t.text();
        assert!(text.starts_with('…') && text.ends_with("the end"));
        assert_eq!(t.bytes.len(), TAIL);
    }

    #[test]
    fn cgroup_hierarchies_are_found_in_the_mount_table() {
        let mountinfo = "\
25 30 0:22 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
26 30 0:23 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
27 30 0:24 /kubepods /elsewhere rw - cgroup cgroup rw,pids
28 30 0:25 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
29 30 0:26 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd";
        assert_eq!(
            cgroup_mount(mountinfo, "memory").as_deref(),
            Some("/sys/fs/cgroup/memory")
        );
        assert_eq!(
            cgroup_mount(mountinfo, "cpu,cpuacct").as_deref(),
            Some("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(
            cgroup_mount(mountinfo, "pids"),
            None,
            "only a whole hierarchy"
        );
        assert_eq!(
            cgroup_mount(mountinfo, "").as_deref(),
            Some("/sys/fs/cgroup/unified")
        );
        assert_eq!(
            cgroup_mount(mountinfo, "name=systemd").as_deref(),
            Some("/sys/fs/cgroup/systemd")
        );
    }
}
