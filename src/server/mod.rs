//! `serve`: the HTTPS admission listener, the admin listener and the lease view.
//! PLACEHOLDER: filled in by the server work.

#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {}

pub async fn run(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("serve is not implemented yet")
}
