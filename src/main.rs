//! The `nodekeeper` executable: parse flags, set up logging, run one
//! subcommand, and turn its error into one line on stderr plus an exit code.
//! Everything else lives in the library (see the architecture map in lib.rs).

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match nodekeeper::cli::args::from_env() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    nodekeeper::logging::init(cli.verbose);
    match nodekeeper::cli::dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("nodekeeper: error: {err}");
            ExitCode::FAILURE
        }
    }
}
