//! Log setup: `env_logger`, by default `info` for nodekeeper and nothing from
//! the libraries under it (kube reports every failed connection attempt at
//! error level; we report the failure ourselves, once, with context).
//! `RUST_LOG` overrides, e.g. `RUST_LOG=nodekeeper=debug,kube=debug`.

/// Initialise the global logger once, before any subcommand runs.
pub fn init(verbose: bool) {
    let default = if verbose {
        "nodekeeper=debug"
    } else {
        "nodekeeper=info"
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format_target(false)
        .init();
}
