//! Every integration test, in one test binary: one module per file beside
//! this one (`tests/<module>.rs`), the shared harness in `tests/support/`.
//!
//! Why one binary: as 29 binaries each compiled the harness again (its
//! ~3 700 lines) and linked the whole dependency tree on its own; after a
//! change to `src/` that was ~4 s of a core per binary before its own
//! tests compiled (`cargo build --timings`), most of the test build.
//! `tests/run-suite` still runs each module as its own process, on the
//! control plane its lane gives it (`suite --exact <its tests>`), so a
//! module sees its cluster as it did as a binary; `just test --only
//! replace` runs one module. Running the binary whole (`cargo test --test
//! suite`) runs every module in one process on one cluster, which the
//! lanes exist to avoid: use `just test`.

mod support;
// Harness parts only some modules use (the real kubelet node, the
// machines that reboot for real, the OS-image machines).
#[path = "support/osmachine.rs"]
mod osmachine;
#[path = "support/realmachine.rs"]
mod realmachine;
#[path = "support/realnode.rs"]
mod realnode;

mod admission;
mod agent;
mod arm64;
mod bad_input;
mod catalogue;
mod cli;
mod cluster;
mod cluster_idle;
mod cluster_role;
mod demo;
mod drain_rules;
mod effects;
mod helm;
mod http2;
mod image;
mod maintain_restart;
mod maintenance;
mod manifests;
mod monitoring;
mod mutex;
mod node_conditions;
mod os_image;
mod package;
mod real_machines;
mod real_node;
mod reboot;
mod reboot_chaos;
mod replace;
mod schema_refusals;
mod single_node;
mod talos;
mod upgrade;
mod volumes;
mod windows;
