//! The `ordo` command: parses the command line (`cli`) and runs a subcommand.

use std::process::ExitCode;

use ordo_server::cli::{self, Command};
use ordo_server::metrics::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() -> ExitCode {
    let cli = match cli::parse(std::env::args_os()) {
        Ok(cli) => cli,
        // Help and `--version` too: clap prints them on stdout and exits 0.
        Err(error) => error.exit(),
    };
    match cli.command {
        Command::Serve(args) => {
            let (format, level) = (args.log_format, args.log_level.clone());
            let options = match args.into_options() {
                Ok(options) => options,
                Err(message) => {
                    eprintln!("ordo: {message}");
                    return ExitCode::from(2);
                }
            };
            if let Err(message) = ordo_server::logging::init(format, level.as_deref()) {
                eprintln!("ordo: {message}");
                return ExitCode::from(2);
            }
            match ordo_server::server::serve(options) {
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    // Into the log, unless its filter would swallow why the server stopped.
                    if tracing::enabled!(tracing::Level::ERROR) {
                        tracing::error!("{message}");
                    } else {
                        eprintln!("ordo: {message}");
                    }
                    ExitCode::FAILURE
                }
            }
        }
        Command::Token(args) => match args.mint() {
            Ok(token) => {
                println!("{token}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("ordo token: {message}");
                ExitCode::from(2)
            }
        },
        Command::Backup(args) => match args.run() {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("ordo backup: {message}");
                ExitCode::FAILURE
            }
        },
        Command::LoadDemo(args) => {
            let address = args.url.trim_start_matches("http://").trim_end_matches('/').to_owned();
            match ordo_server::demo_data::load_demo(&address, args.rooms) {
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    eprintln!("ordo: {message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
