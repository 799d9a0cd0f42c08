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
    // env_logger's own layout (`[time LEVEL] message`), with the time
    // written by jiff, which the binary carries anyway: env_logger's
    // `humantime` feature cost more bytes than this closure.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format(|buf, record| {
            use std::io::Write as _;
            // Milliseconds at debug level, where the log is a timeline
            // (a round's writes, the drain's steps); seconds otherwise.
            let unit = if log::max_level() >= log::LevelFilter::Debug {
                jiff::Unit::Millisecond
            } else {
                jiff::Unit::Second
            };
            let now = jiff::Timestamp::now()
                .round(unit)
                .unwrap_or_else(|_| jiff::Timestamp::now());
            writeln!(buf, "[{now} {:<5}] {}", record.level(), record.args())
        })
        .init();
}
