//! Unit tests of `host`.

use super::*;

#[test]
fn commands_report_exit_codes_and_output() {
    crate::runtime::block_on(async {
        assert_eq!(run(&["true".into()]).await, Ok((0, String::new())));
        let (code, out) = run(&["sh".into(), "-c".into(), "echo nope >&2; exit 3".into()])
            .await
            .unwrap_or_default();
        assert_eq!((code, out.as_str()), (3, "nope"));
        assert!(command(&["false".into()], COMMAND_TIMEOUT).await.is_err());
        let missing = run(&["/nonexistent/reboot".into()]).await;
        assert!(missing.is_err_and(|e| e.contains("/nonexistent/reboot")));
        assert_eq!(
            sentinel_command(
                &["sh".into(), "-c".into(), "exit 1".into()],
                COMMAND_TIMEOUT
            )
            .await,
            Ok(false)
        );
        // A hanging sentinel is killed at its limit and reported.
        let hung =
            sentinel_command(&["sleep".into(), "30".into()], Duration::from_millis(200)).await;
        assert!(hung.is_err_and(|e| e.contains("still running")));
    });
}

/// The process group a shell wrote to `file` (its `$$`), once it has.
fn group_in(file: &Path) -> i32 {
    for _ in 0..500 {
        if let Some(pgid) = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pgid;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the command never wrote {}", file.display());
}

/// Whether `pid` still runs (a zombie waiting for its reaper does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nk-host-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_default();
    dir
}

#[test]
fn a_command_past_its_deadline_is_killed_with_its_children() {
    let dir = scratch("deadline");
    let child = dir.join("child");
    let script = format!("sleep 30 & echo $! > {}; wait", child.display());
    let out = crate::runtime::block_on(run_for(
        &["sh".into(), "-c".into(), script],
        Duration::from_millis(300),
    ));
    assert!(out.is_err_and(|e| e.contains("still running")));
    let pid = group_in(&child);
    for _ in 0..200 {
        if !alive(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the shell's child {pid} outlived the deadline");
}

#[test]
fn a_check_stops_with_the_agent_and_a_reboot_or_upgrade_command_does_not() {
    let dir = scratch("stop");
    let (check_file, action_file) = (dir.join("check"), dir.join("action"));
    let argv = |f: &Path| -> Vec<String> {
        let script = format!("echo $$ > {}; sleep 30", f.display());
        vec!["sh".into(), "-c".into(), script]
    };
    let check = crate::runtime::spawn(async move {
        sentinel_command(&argv(&check_file), Duration::from_secs(60)).await
    });
    let action = crate::runtime::spawn({
        let argv = argv(&action_file);
        async move { command(&argv, Duration::from_secs(60)).await }
    });
    let (check_group, action_group) = (group_in(&dir.join("check")), group_in(&dir.join("action")));
    assert!(
        !stop_check(action_group),
        "a reboot or upgrade command runs on"
    );
    assert!(stop_check(check_group));
    let answer = crate::runtime::block_on(check);
    assert!(answer.is_err(), "{answer:?}");
    assert!(alive(action_group));
    // Its task dropped (not the agent stopping), its group goes.
    crate::runtime::block_on(action.cancel());
    assert!(!running().contains_key(&action_group));
}

#[test]
fn can_run_finds_programs_and_names_what_is_wrong() {
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        can_run(&argv(&["/bin/sh", "-c", "true"]), Exec::Direct),
        Ok(())
    );
    assert_eq!(can_run(&argv(&["sh"]), Exec::Direct), Ok(()));
    assert_eq!(
        can_run(&argv(&["/nonexistent/upgrade", "v2"]), Exec::Direct),
        Err("/nonexistent/upgrade: not found".into())
    );
    assert_eq!(
        can_run(&argv(&["no-such-program-anywhere"]), Exec::Direct),
        Err("no-such-program-anywhere: not found".into())
    );
    assert_eq!(
        can_run(&[], Exec::Direct),
        Err("the command is empty".into())
    );
    assert_eq!(
        can_run(&argv(&[""]), Exec::Direct),
        Err("the command is empty".into())
    );
    let dir = std::env::temp_dir().join(format!("nk-can-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain = dir.join("plain");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let plain = plain.display().to_string();
    assert_eq!(
        can_run(std::slice::from_ref(&plain), Exec::Direct),
        Err(format!("{plain}: not executable"))
    );
    let d = dir.display().to_string();
    assert_eq!(
        can_run(std::slice::from_ref(&d), Exec::Direct),
        Err(format!("{d}: not a file"))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sentinel_file_counts_only_when_present() {
    let dir = std::env::temp_dir().join(format!("nk-sentinel-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let root = HostRoot(dir.clone());
    assert_eq!(sentinel_file(&root, "/reboot-required"), Ok(false));
    let _ = std::fs::write(dir.join("reboot-required"), "");
    assert_eq!(sentinel_file(&root, "/reboot-required"), Ok(true));
    assert_eq!(sentinel_file(&root, ""), Ok(false), "empty turns it off");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A host root whose `/var/run` is `-> /run` (absolute, as on Debian,
/// Ubuntu, Fedora): the sentinel is found in the host's /run, never
/// in ours; `..` and chains of links stay inside the root.
#[test]
fn symlinks_under_the_host_root_resolve_inside_it() {
    let dir = std::env::temp_dir().join(format!("nk-in-root-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("run")).unwrap();
    std::fs::create_dir_all(dir.join("var")).unwrap();
    std::fs::create_dir_all(dir.join("usr/bin")).unwrap();
    std::os::unix::fs::symlink("/run", dir.join("var/run")).unwrap();
    std::os::unix::fs::symlink("usr/bin", dir.join("bin")).unwrap();
    std::os::unix::fs::symlink("../../../../../run/x", dir.join("usr/up")).unwrap();
    std::os::unix::fs::symlink("/loop", dir.join("loop")).unwrap();
    let root = HostRoot(dir.clone());
    assert_eq!(sentinel_file(&root, "/var/run/reboot-required"), Ok(false));
    std::fs::write(dir.join("run/reboot-required"), "").unwrap();
    assert_eq!(sentinel_file(&root, "/var/run/reboot-required"), Ok(true));
    assert_eq!(in_root(&dir, Path::new("/bin/sh")), dir.join("usr/bin/sh"));
    assert_eq!(in_root(&dir, Path::new("/usr/up")), dir.join("run/x"));
    assert_eq!(in_root(&dir, Path::new("/loop/a")), dir.join("loop/a"));
    assert_eq!(
        in_root(Path::new("/"), Path::new("/var/run")),
        PathBuf::from("/var/run")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn boot_time_is_read_from_proc_stat() {
    assert!(boot_time(Path::new("/proc/stat")).is_some());
    assert!(truncate("x".repeat(1000)).len() < 410);
}
