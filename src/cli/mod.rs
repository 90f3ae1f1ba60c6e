//! Subcommands of the `remat` binary, one module each.

pub mod advise;
mod charts;
mod config;
mod demo;
pub mod plan;
pub mod replay;
mod tables;

use clap::{Parser, Subcommand};

/// remat: a caching allocator, rematerialization and static planning for Rust ML.
#[derive(Debug, Parser)]
#[command(name = "remat", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// How much memory a training step can save, and at what cost: replays
    /// a trace as training iterations over budgets from its peak down to its
    /// floor and prints the overhead curve.
    Advise(Box<advise::AdviseArgs>),
    /// Allocator configuration (REMAT_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF syntax).
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Replays an allocation pattern through the caching allocator and prints its summary.
    Demo(demo::DemoArgs),
    /// Plans a trace's storages into one arena (static planning) and compares
    /// with the lower bound and the caching allocator.
    Plan(plan::PlanArgs),
    /// Replays a DTR-paper trace through the DTR runtime under a memory budget
    /// (or sweeps traces × ratios × policies).
    Replay(Box<replay::ReplayArgs>),
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Advise(a) => advise::run(*a),
        Command::Config(c) => config::run(c),
        Command::Demo(a) => demo::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Replay(a) => replay::run(*a),
    }
}
