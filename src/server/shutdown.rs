//! Process signals that start a graceful shutdown.

/// Resolves on the first SIGTERM or SIGINT.
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                tracing::info!(signal = name, "shutting down");
                return;
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM/SIGINT; falling back to Ctrl-C only");
            }
        }
    }
    match tokio::signal::ctrl_c().await {
        Ok(()) => tracing::info!(signal = "SIGINT", "shutting down"),
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for Ctrl-C; graceful shutdown by signal is unavailable");
            std::future::pending::<()>().await;
        }
    }
}
