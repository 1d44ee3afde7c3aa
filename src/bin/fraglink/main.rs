//! The fraglink command line.

mod catalog;
mod doctor;
mod expand;
mod index;
mod ivf_search;
mod link;
mod prelink;
mod repeat;
mod search;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "fraglink",
    version,
    about = "CUDA JIT link-time optimisation for Rust GPU libraries"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Expand a parameter matrix (cuVS semantics) into its entries.
    Expand(expand::ExpandArgs),
    /// List every embedded fragment.
    Catalog(catalog::CatalogArgs),
    /// Link fragments into a cubin with nvJitLink (cached in memory and on disk).
    Link(link::LinkArgs),
    /// Link plans ahead of time into the disk cache: from a profile
    /// (FRAGLINK_PROFILE), one family, or all of them.
    Prelink(prelink::PrelinkArgs),
    /// Inspect or clear the disk cache of linked cubins.
    #[command(subcommand)]
    Cache(link::CacheCommand),
    /// Where this binary finds its CUDA libraries and headers, the driver, the GPUs, the caches.
    Doctor(doctor::DoctorArgs),
    /// Build an index file for approximate search (IVF-Flat).
    #[command(subcommand)]
    Index(index::IndexCommand),
    /// Exact k-NN search end to end (the GPU plan, routing, QPS, recall).
    Search(search::SearchArgs),
}

/// A closed stdout (`fraglink catalog --json | head`) ends the process the
/// way it ends other command-line tools, by SIGPIPE. Rust ignores SIGPIPE, so
/// `println!` would panic on the broken pipe instead.
fn default_sigpipe() {
    // SAFETY: restoring a signal's default disposition at start-up, before
    // any thread exists; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    default_sigpipe();
    let cli = Cli::parse();
    match &cli.command {
        Command::Expand(a) => expand::run(a),
        Command::Catalog(a) => catalog::run(a),
        Command::Link(a) => link::run(a),
        Command::Prelink(a) => prelink::run(a),
        Command::Cache(c) => link::run_cache(c),
        Command::Search(a) => search::run(a),
        Command::Index(c) => index::run(c),
        Command::Doctor(a) => doctor::run(a),
    }
}
