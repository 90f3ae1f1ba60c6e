//! `remat config check "<settings>"`: parse a settings string and print the
//! effective settings, or the error.

use clap::Subcommand;
use remat_alloc::AllocatorConfig;

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Parses a settings string (`key:value,…`) and prints every effective setting.
    /// With no string, reads REMAT_ALLOC_CONF (falling back to PYTORCH_CUDA_ALLOC_CONF).
    Check {
        /// The settings, e.g. "max_split_size_mb:128,expandable_segments:True".
        settings: Option<String>,
    },
}

pub fn run(cmd: ConfigCommand) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        ConfigCommand::Check { settings } => {
            let (config, source) = match settings {
                Some(s) => (AllocatorConfig::parse(&s)?, "the command line".to_string()),
                None => {
                    let (c, var) = AllocatorConfig::from_env_with_source()?;
                    (
                        c,
                        var.map_or("defaults (no variable set)".to_string(), |v| {
                            format!("${v}")
                        }),
                    )
                }
            };
            println!("settings from {source}: ok");
            let settings = config.effective_settings();
            let width = settings.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
            for (k, v) in settings {
                println!("  {k:<width$}  {v}");
            }
            Ok(())
        }
    }
}
