//! `hookd send` (being written).
use clap::Args;
#[derive(Debug, Args)]
pub struct SendArgs {}
pub async fn run(_args: SendArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
