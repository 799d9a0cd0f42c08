//! Deflates the checked-in CRD files (`src/api/*crds.json`) into `OUT_DIR`,
//! where `api` embeds them: 118 KB of JSON, most of it descriptions that
//! repeat (every label selector's), is 22 KB deflated, and the inflater
//! costs the binary far less than the difference. The JSON files stay the
//! reviewable source; a unit test checks that the embedded bytes inflate
//! back to them.

use std::path::Path;

const FILES: [&str; 3] = ["crds.json", "mutex-crds.json", "constellation-crds.json"];

fn main() {
    let out = std::env::var("OUT_DIR").unwrap_or_else(|_| fail("cargo set no OUT_DIR"));
    for file in FILES {
        let source = Path::new("src/api").join(file);
        println!("cargo:rerun-if-changed={}", source.display());
        let json = std::fs::read(&source)
            .unwrap_or_else(|e| fail(&format!("reading {}: {e}", source.display())));
        // Level 10: miniz's best; deterministic, so two builds of one
        // commit embed the same bytes.
        let deflated = miniz_oxide::deflate::compress_to_vec(&json, 10);
        let target = Path::new(&out).join(format!("{file}.deflate"));
        std::fs::write(&target, deflated)
            .unwrap_or_else(|e| fail(&format!("writing {}: {e}", target.display())));
    }
    println!("cargo:rerun-if-changed=build.rs");
}

fn fail(why: &str) -> ! {
    eprintln!("build.rs: {why}");
    std::process::exit(1)
}
