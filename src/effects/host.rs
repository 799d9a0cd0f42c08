//! Host actions: the only module that touches the machine nodekeeper runs
//! on (or, for the cluster role's remote command, reaches out from). It runs
//! argv templates — never a shell string built from object fields — with a
//! timeout, and returns their output truncated for status and events; and
//! it reads the host's reboot signals (sentinel file, sentinel command).
//!
//! In a container (the reboot DaemonSet, with host PID) commands run in the
//! host's mount namespace through [`host_exec`]: `nodekeeper host-exec --
//! ARGV` joins PID 1's mount namespace and execs, which is what kured does
//! with `nsenter -m/proc/1/ns/mnt`; a scratch image has no nsenter.

use std::path::{Path, PathBuf};
use std::time::Duration;

use smol::future::FutureExt;

/// How long a host command may run before it counts as failed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// Output kept for status and events.
const OUTPUT_LIMIT: usize = 400;

/// How host commands are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Exec {
    /// Directly: nodekeeper runs on the host (systemd, Talos) or the
    /// command is a remote one (cluster role).
    #[default]
    Direct,
    /// Through `nodekeeper host-exec`, in PID 1's mount namespace (`run
    /// --host-exec`; a container with host PID).
    HostNamespace,
}

/// This very binary, to start again as a helper (`host-exec`, the
/// `host-run` supervisor): the running process's own file, which stays
/// valid when the file on disk is replaced (a package upgrade, a new
/// static binary); `current_exe()` then names `… (deleted)` and every
/// host command failed until the agent restarted.
pub const SELF_EXE: &str = "/proc/self/exe";

/// The argv to start for `argv` under `exec`.
pub fn command_line(argv: &[String], exec: Exec) -> Vec<String> {
    match exec {
        Exec::Direct => argv.to_vec(),
        Exec::HostNamespace => {
            let me = SELF_EXE.to_string();
            let mut v = vec![me, "host-exec".into(), "--".into()];
            v.extend(argv.iter().cloned());
            v
        }
    }
}

/// How long a look at the host's file system may take (a hung NFS mount,
/// a stuck disk): it runs on a blocking thread, never on the loop's.
pub const FS_LOOK_DEADLINE: Duration = Duration::from_secs(10);

/// `look` on the blocking pool, within [`FS_LOOK_DEADLINE`].
pub(crate) async fn bounded<T: Send + 'static>(
    look: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    crate::runtime::timeout(FS_LOOK_DEADLINE, smol::unblock(look))
        .await
        .unwrap_or_else(|()| {
            Err(format!(
                "the host's file system did not answer within {} s",
                FS_LOOK_DEADLINE.as_secs()
            ))
        })
}

/// [`can_run`] for each of `argvs` (the first that cannot says why), off
/// the loop's thread, within [`FS_LOOK_DEADLINE`].
pub async fn can_run_bounded(argvs: Vec<Vec<String>>, exec: Exec) -> Result<(), String> {
    bounded(move || argvs.iter().try_for_each(|argv| can_run(argv, exec))).await
}

/// [`sentinel_file`] off the loop's thread, within [`FS_LOOK_DEADLINE`].
pub async fn sentinel_file_bounded(root: HostRoot, file: String) -> Result<bool, String> {
    bounded(move || sentinel_file(&root, &file)).await
}

/// Can `argv` be started where [`command_line`] would start it: its program
/// found (on `PATH` when it has no `/`) as an executable file? Read from the
/// file system only; the loop calls [`can_run_bounded`]. Where the host's
/// file system cannot be looked at (no access to PID 1's root), the answer
/// is yes: the command itself will say.
pub fn can_run(argv: &[String], exec: Exec) -> Result<(), String> {
    let program = argv
        .first()
        .filter(|p| !p.trim().is_empty())
        .ok_or("the command is empty")?;
    let root = match exec {
        Exec::Direct => PathBuf::from("/"),
        Exec::HostNamespace => PathBuf::from("/proc/1/root"),
    };
    if std::fs::read_dir(&root).is_err() {
        return Ok(());
    }
    let search: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        let path = match exec {
            Exec::Direct => std::env::var("PATH").unwrap_or_default(),
            Exec::HostNamespace => String::new(),
        };
        let path = if path.is_empty() {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()
        } else {
            path
        };
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(program))
            .collect()
    };
    let mut why = format!("{program}: not found");
    for candidate in &search {
        let on_host = in_root(&root, candidate);
        match std::fs::metadata(&on_host) {
            Ok(m)
                if m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0 =>
            {
                return Ok(());
            }
            Ok(m) if m.is_file() => why = format!("{}: not executable", candidate.display()),
            Ok(_) => why = format!("{}: not a file", candidate.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Cannot tell (permissions): let the command say.
            Err(_) => return Ok(()),
        }
    }
    Err(why)
}

/// `nodekeeper host-exec -- ARGV`: join PID 1's (or `pid`'s) mount namespace, then
/// replace this process with ARGV. Must run before any thread starts (a
/// multithreaded process cannot change its mount namespace). Returns only
/// on failure, with the reason.
pub fn host_exec(pid: u32, argv: &[String]) -> String {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = argv.split_first() else {
        return "host-exec needs a command after --".into();
    };
    let path = format!("/proc/{pid}/ns/mnt");
    let ns = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            return format!(
                "opening {path}: {e} (needs host PID and root; see the README's reboot DaemonSet)"
            );
        }
    };
    if let Err(e) = rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&ns),
        Some(rustix::thread::LinkNameSpaceType::Mount),
    ) {
        return format!(
            "joining the host's mount namespace: {e} (needs CAP_SYS_ADMIN and CAP_SYS_CHROOT)"
        );
    }
    let err = std::process::Command::new(program).args(args).exec();
    format!("{program}: {err}")
}

/// Run `argv` and wait for it (at most [`COMMAND_TIMEOUT`]). `Ok` carries
/// the exit code and output; `Err` says why it could not run or finish.
pub async fn run(argv: &[String]) -> Result<(i32, String), String> {
    run_for(argv, COMMAND_TIMEOUT).await
}

/// [`run`] with its own time limit, for a check (a sentinel command): it
/// ends with this process ([`stop_checks`]).
pub async fn run_for(argv: &[String], limit: Duration) -> Result<(i32, String), String> {
    run_in_group(argv, limit, Lifetime::Check).await
}

/// Whether a host command may outlive the agent that started it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lifetime {
    /// A check: stopped when the agent stops (a hanging sentinel command
    /// was left behind for as long as it hung).
    Check,
    /// A reboot or upgrade command: left to finish (cutting an upgrade
    /// short when the agent restarts would leave the node half-upgraded).
    Action,
}

/// The process groups of host commands running now, and their lifetimes.
static RUNNING: std::sync::Mutex<std::collections::BTreeMap<i32, Lifetime>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn running() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<i32, Lifetime>> {
    RUNNING.lock().unwrap_or_else(|p| p.into_inner())
}

/// One host command's process group while it runs: dropped before the
/// command was answered (its deadline passed, or its task was dropped),
/// it kills the whole group, a shell's children included, which killing
/// the direct child alone left running.
struct Group {
    pgid: i32,
    answered: bool,
}

impl Drop for Group {
    fn drop(&mut self) {
        running().remove(&self.pgid);
        if !self.answered {
            signal_group(self.pgid, rustix::process::Signal::KILL);
        }
    }
}

fn signal_group(pgid: i32, signal: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pgid) {
        // Gone already (ESRCH) is what we want.
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// Stop every check still running (SIGTERM to its process group): the
/// agent is stopping and no one will read their answers. Reboot and
/// upgrade commands are left to finish.
pub fn stop_checks() {
    let pgids: Vec<i32> = running().keys().copied().collect();
    for pgid in pgids {
        stop_check(pgid);
    }
}

/// Stop the process group `pgid` if it is a check's; whether it was.
fn stop_check(pgid: i32) -> bool {
    if running().get(&pgid) != Some(&Lifetime::Check) {
        return false;
    }
    log::info!("stopping host command (process group {pgid}): the agent is stopping");
    signal_group(pgid, rustix::process::Signal::TERM);
    true
}

/// Run `argv` in a process group of its own for at most `limit`.
async fn run_in_group(
    argv: &[String],
    limit: Duration,
    lifetime: Lifetime,
) -> Result<(i32, String), String> {
    use std::os::unix::process::CommandExt;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| "empty command".to_string())?;
    let mut std_command = std::process::Command::new(program);
    std_command
        .args(args)
        .stdin(std::process::Stdio::null())
        .process_group(0);
    let child = smol::process::Command::from(std_command)
        .stdout(smol::process::Stdio::piped())
        .stderr(smol::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    let pgid = child.id() as i32;
    running().insert(pgid, lifetime);
    let mut group = Group {
        pgid,
        answered: false,
    };
    let timeout = async {
        crate::runtime::sleep(limit).await;
        Err(std::io::Error::other(format!(
            "still running after {} s",
            limit.as_secs()
        )))
    };
    let out = child
        .output()
        .or(timeout)
        .await
        .map_err(|e| format!("{}: {e}", program))?;
    group.answered = true;
    drop(group);
    let mut text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if text.is_empty() {
        text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    Ok((out.status.code().unwrap_or(-1), truncate(text)))
}

/// Run a reboot or upgrade command for at most `limit`: success is exit
/// 0. (`systemctl reboot` returns once the shutdown is queued; the machine
/// then goes down.)
pub async fn command(argv: &[String], limit: Duration) -> Result<(), String> {
    match run_in_group(argv, limit, Lifetime::Action).await? {
        (0, _) => Ok(()),
        (code, out) if out.is_empty() => Err(format!("{} exited with {code}", argv[0])),
        (code, out) => Err(format!("{} exited with {code}: {out}", argv[0])),
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > OUTPUT_LIMIT {
        let mut cut = OUTPUT_LIMIT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// Where the host's file system is: `/` on the host, or where a container
/// mounts it (`--host-root`).
#[derive(Debug, Clone)]
pub struct HostRoot(pub PathBuf);

impl HostRoot {
    fn path(&self, p: &str) -> PathBuf {
        in_root(&self.0, Path::new(p))
    }
}

/// `path` as a process whose root is `root` sees it: each symlink on the
/// way, the last one too, resolved inside `root` (an absolute target starts
/// again at `root`, `..` stops there). Needed because through `/proc/1/root`
/// the kernel resolves an absolute symlink against the *caller's* root:
/// `/var/run` is `-> /run` on nearly every distribution, so the DaemonSet's
/// agent looked for kured's `/var/run/reboot-required` in its own
/// container's `/run` and never saw one (found on the test machines,
/// tests/real_machines.rs). At most 40 links, as the kernel.
pub fn in_root(root: &Path, path: &Path) -> PathBuf {
    use std::path::Component;
    if root == Path::new("/") {
        return path.to_path_buf();
    }
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut inside = PathBuf::new();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            inside.pop();
            continue;
        }
        let next = inside.join(&part);
        match std::fs::read_link(root.join(&next)) {
            Ok(target) if links < 40 => {
                links += 1;
                if target.is_absolute() {
                    inside = PathBuf::new();
                }
                pending.extend(target.components().rev().filter_map(|c| match c {
                    Component::Normal(n) => Some(n.to_os_string()),
                    Component::ParentDir => Some("..".into()),
                    _ => None,
                }));
            }
            _ => inside = next,
        }
    }
    root.join(inside)
}

/// Does the sentinel file say a reboot is needed? Only a file written in
/// the current boot counts: one left on a persistent path from before the
/// last boot would otherwise reboot the node forever (kured #976's loop).
pub fn sentinel_file(root: &HostRoot, file: &str) -> Result<bool, String> {
    if file.is_empty() {
        return Ok(false);
    }
    let path = root.path(file);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let Some(booted) = boot_time(Path::new("/proc/stat")) else {
        return Ok(true);
    };
    let written = meta
        .modified()
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(written >= booted)
}

/// The sentinel command's answer, kured's contract: 0 needed, 1 not,
/// anything else an error that counts as not needed.
pub async fn sentinel_command(argv: &[String], limit: Duration) -> Result<bool, String> {
    match run_for(argv, limit).await? {
        (0, _) => Ok(true),
        (1, _) => Ok(false),
        (code, out) => Err(format!("sentinel command exited with {code}: {out}")),
    }
}

/// When the machine booted (`btime` in /proc/stat; the host's, also in a
/// container).
fn boot_time(stat: &Path) -> Option<std::time::SystemTime> {
    let text = std::fs::read_to_string(stat).ok()?;
    let secs: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests;
