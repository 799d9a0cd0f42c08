//! `just bench-startup`: what a node pays to carry nodekeeper: the static
//! binary's size, the image archives' sizes, and how long the commands an
//! OS image or init system runs first take from exec to exit (`version`,
//! `manifests --for k3s`, `manifests --for static-pod`). A benchmark, not a
//! test: it prints a table and asserts nothing about time.
//!
//! The binary is `NODEKEEPER_BIN` (the Justfile passes the static one);
//! archives are read from `target/image` if `just image` built them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 200;

fn main() {
    let bin = std::env::var_os("NODEKEEPER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("target/x86_64-unknown-linux-musl/release/nodekeeper")
        });
    let Ok(meta) = std::fs::metadata(&bin) else {
        eprintln!(
            "bench-startup: no binary at {}; run just build-static",
            bin.display()
        );
        std::process::exit(1);
    };
    println!("binary: {}", bin.display());
    println!();
    println!("| artifact | size |");
    println!("|---|---|");
    println!("| static binary | {} |", mib(meta.len()));
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/image");
    let mut archives: Vec<_> = std::fs::read_dir(&images)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    archives.retain(|p: &PathBuf| p.to_string_lossy().ends_with(".oci.tar"));
    archives.sort();
    for a in &archives {
        let size = std::fs::metadata(a).map(|m| m.len()).unwrap_or(0);
        let name = a.file_name().unwrap_or_default().to_string_lossy();
        println!("| {name} | {} |", mib(size));
    }
    if archives.is_empty() {
        println!("| image archives | not built (just image) |");
    }
    println!();
    println!("| command ({RUNS} runs, exec to exit) | median | p95 | max |");
    println!("|---|---|---|---|");
    for args in [
        &["version"][..],
        &["manifests", "--for", "k3s"][..],
        &["manifests", "--for", "static-pod"][..],
    ] {
        let mut times: Vec<Duration> = (0..RUNS)
            .map(|_| {
                let start = Instant::now();
                let status = Command::new(&bin)
                    .args(args)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                let took = start.elapsed();
                if !status.is_ok_and(|s| s.success()) {
                    eprintln!("bench-startup: nodekeeper {} failed", args.join(" "));
                    std::process::exit(1);
                }
                took
            })
            .collect();
        times.sort();
        let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        println!(
            "| nodekeeper {} | {} | {} | {} |",
            args.join(" "),
            ms(pick(0.5)),
            ms(pick(0.95)),
            ms(pick(1.0))
        );
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB ({bytes} bytes)", bytes as f64 / 1048576.0)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}
