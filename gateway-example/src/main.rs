//! `gateway-example --config PATH [--host H] [--port P] [--data-dir DIR] [--allow-known-master-key]
//! [--ignore-unsupported KEY,...]`, or
//! `gateway-example import-litellm --database-url URL [--into URL]`.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;

// The allocator: Cargo features `jemalloc` (default; not with MSVC), `mimalloc`, or neither (the
// system's). jemalloc's background thread purges freed pages while the gateway is idle.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
#[cfg(all(
    feature = "mimalloc",
    not(all(feature = "jemalloc", not(target_env = "msvc")))
))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use gateway_example::signal::shutdown_signal;
use gateway_example::{app, Gateway};

/// An OpenAI-compatible gateway with priority-aware RPM/TPM limits.
#[derive(Debug, Parser)]
#[command(
    version,
    about,
    long_about = None,
    after_help = "To bring a LiteLLM deployment's keys and teams over: \
                  gateway-example import-litellm --help"
)]
struct Args {
    /// Config file (the source product's config.yaml shape: model_list, litellm_settings,
    /// general_settings, router_settings).
    #[arg(long, env = "GATEWAY_CONFIG")]
    config: PathBuf,
    /// Address to listen on (loopback by default: pass e.g. `--host 0.0.0.0` to serve other
    /// machines).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 4000)]
    port: u16,
    /// Directory where keys and teams persist across restarts (unless Redis is configured:
    /// `router_settings.redis_url` / `redis_host` / `redis_startup_nodes`, or `REDIS_URL` /
    /// `REDIS_HOST`).
    #[arg(long, default_value = "./.gateway-data")]
    data_dir: PathBuf,
    /// Serve on a non-loopback address even though the master key is a publicly known one (the
    /// quick start's `sk-1234`), which lets anyone who can reach the address manage keys.
    #[arg(long)]
    allow_known_master_key: bool,
    /// Start even though the config sets these keys, which decide who may do what or what is
    /// enforced and which this gateway does not honour (by key, `guardrails`, or by YAML path,
    /// `model_list[0].litellm_params.tags`); they are named in a warning instead.
    #[arg(long, value_delimiter = ',', value_name = "KEY,...")]
    ignore_unsupported: Vec<String>,
}

/// Reads a LiteLLM deployment's virtual keys and teams from its own tables
/// (LiteLLM_VerificationToken, LiteLLM_TeamTable) and writes them to the gateway's tables in
/// Postgres, so the keys LiteLLM issued work here unchanged. Settings the gateway does not honour
/// are listed by name; keys already there are left as they are (running it again is safe).
#[derive(Debug, Parser)]
#[command(name = "gateway-example import-litellm", version)]
struct ImportArgs {
    /// LiteLLM's database (its DATABASE_URL): postgres://user:password@host:port/database.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The gateway's database (its general_settings.database_url); default: the same database,
    /// where the gateway's own tables (tpl_*) sit beside LiteLLM's.
    #[arg(long)]
    into: Option<String>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    gateway_example::logging::init("info", gateway_example::logging::Output::Stdout);
    let result = if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "import-litellm")
    {
        import_litellm(ImportArgs::parse_from(std::env::args_os().skip(1))).await
    } else {
        run(Args::parse()).await
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("gateway-example: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn import_litellm(args: ImportArgs) -> Result<(), String> {
    use gateway_example::config::DatabaseUrl;
    let from =
        DatabaseUrl::parse(&args.database_url, "--database-url").map_err(|e| e.to_string())?;
    let into = match &args.into {
        Some(url) => DatabaseUrl::parse(url, "--into").map_err(|e| e.to_string())?,
        None => from.clone(),
    };
    let report = gateway_example::keys::litellm::import(&from, &into)
        .await
        .map_err(|e| e.to_string())?;
    // Not `print!`: a reader that stops early (`| head`) must not make it panic.
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match write!(out, "{report}").and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!(
            "the import is done; writing its report failed: {e}"
        )),
        _ => Ok(()),
    }
}

async fn run(args: Args) -> Result<(), String> {
    // The same reading and error as a reload's (`SIGHUP`, `POST /config/reload`).
    let (config, document) = gateway_example::load_file(&args.config, &args.ignore_unsupported)?;
    if config.master_key.is_none() {
        tracing::warn!(
            "no general_settings.master_key and no LITELLM_MASTER_KEY: the gateway is open to anyone who can reach it"
        );
    }
    // Models are only ever the config's (none are kept in a database): without one, every
    // model request is a 400.
    if config.deployments.is_empty() {
        tracing::warn!(
            "model_list is empty (or missing): every model request will be refused as an unknown model"
        );
    }
    // Bound (and checked) before the gateway is built, so a refusal touches no data.
    let addr = format!("{}:{}", args.host, args.port);
    // Before anything opens files: clients, not a default of 1024, should meet max_connections.
    gateway_example::server::raise_file_limit();
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("binding {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    // Checked on the address actually bound, so a host name is judged by what it resolved to.
    if !local.ip().is_loopback() && config.has_known_master_key() {
        if !args.allow_known_master_key {
            return Err(format!(
                "refusing to listen on {local} with a publicly known master key (the quick \
                 start's): anyone who can reach this address could use it. Set \
                 general_settings.master_key to a secret of your own, listen on loopback \
                 (--host 127.0.0.1, the default), or pass --allow-known-master-key to do it anyway"
            ));
        }
        tracing::warn!(
            "listening on {local} with a publicly known master key (--allow-known-master-key)"
        );
    }
    let gateway = Gateway::builder(config)
        .data_dir(&args.data_dir)
        .config_file(&args.config, document)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(
        models = ?gateway.config().model_names(),
        limiter = gateway.config().limiter_enabled,
        key_store = gateway.keys().kind(),
        data_dir = %args.data_dir.display(),
        "starting"
    );
    let gateway = Arc::new(gateway);
    let app = app(gateway.clone());
    // Listened for before "listening on" (what scripts and tests wait for), so none is lost.
    let shutdown = shutdown_signal();
    let limits = gateway_example::server::ServerLimits::from_config(&gateway.config());
    // SIGHUP: read the config file again, as `POST /config/reload` does.
    tokio::spawn(gateway_example::signal::on_hangup({
        let gateway = gateway.clone();
        move || {
            let gateway = gateway.clone();
            async move {
                match gateway.reload().await {
                    Ok(done) => tracing::info!(
                        limits_changed = done.limits_changed,
                        "SIGHUP: config reloaded"
                    ),
                    Err(e) => {
                        tracing::error!("SIGHUP: config not reloaded, the running one stays: {e}")
                    }
                }
            }
        }
    }));
    if let Some(fingerprint) = gateway.config_fingerprint() {
        tracing::info!(config = fingerprint, "config in force");
    }
    // Its own line, the address last: what scripts and tests read.
    tracing::info!("listening on http://{local}");
    // Records made under another config may hold limits this one cannot apply: said, not
    // left to do nothing (in the background: a large key store is read once).
    tokio::spawn({
        let gateway = gateway.clone();
        async move {
            match gateway.unapplied_settings().await {
                Ok(found) => {
                    // A few lines, not one per key of a large store.
                    const SHOWN: usize = 20;
                    for what in found.iter().take(SHOWN) {
                        tracing::warn!("a stored setting this config cannot apply as set: {what}");
                    }
                    if found.len() > SHOWN {
                        tracing::warn!(
                            "and {} more stored settings of keys and teams this config cannot \
                             apply as set (/key/list?return_full_object=true shows the keys')",
                            found.len() - SHOWN
                        );
                    }
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "could not read the keys and teams to check their settings against this config"
                ),
            }
        }
    });
    gateway_example::server::warn_if_file_limit_is_low(limits.max_connections);
    // SIGINT or SIGTERM: stop accepting, let in-flight requests and streams finish for up to
    // the grace period, then end them.
    let grace = limits.shutdown_grace;
    gateway_example::server::serve(
        listener,
        app,
        limits,
        async {
            shutdown.await;
            tracing::info!(
                "shutting down: in-flight requests have {:.1} s to finish",
                grace.as_secs_f64()
            );
        },
        || gateway.end_streams(),
    )
    .await;
    // Keys are written through on every change; the limiter's queued settlements (Redis) are
    // sent before the process ends.
    gateway.flush().await;
    tracing::info!("stopped: in-flight requests finished or ended, settlements flushed");
    Ok(())
}
