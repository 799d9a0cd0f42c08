//! The `nodekeeper` executable: parse flags, set up logging, run one
//! subcommand, and turn its error into one line on stderr plus an exit code.
//! Everything else lives in the library (see the architecture map in lib.rs).

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match nodekeeper::cli::args::from_env() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let format = cli.log_format();
    nodekeeper::logging::init(cli.verbose, format);
    match nodekeeper::cli::dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            // The one line a failed start leaves, in the log's own layout
            // (a pipeline reading JSON lines would drop a plain one).
            match format {
                nodekeeper::logging::Format::Text => eprintln!("nodekeeper: error: {err}"),
                nodekeeper::logging::Format::Json => eprintln!(
                    "{}",
                    nodekeeper::logging::json_line(
                        &jiff_now(),
                        log::Level::Error,
                        "nodekeeper",
                        &err.to_string()
                    )
                ),
            }
            ExitCode::FAILURE
        }
    }
}

fn jiff_now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}
