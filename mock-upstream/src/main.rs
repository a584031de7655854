//! `mock-upstream`: mock OpenAI and Anthropic deployments for load benches and the routing
//! simulator.
//!
//! ```sh
//! mock-upstream --ports 9001,9002,9003,9004 --rpm 600 --latency exp --latency-ms 140
//! ```
//!
//! Each port is an independent deployment (own window, counters and random stream) with the same
//! settings; one URL per line is printed to stdout once all of them listen. `GET /stats` on a port
//! reads its counters; on SIGINT/SIGTERM the final counters go to stderr and the process exits 0.
//! See `mock_upstream` for what a deployment does.

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use gateway_example::signal::shutdown_signal;
use mock_upstream::{Latency, MockUpstream, MockUpstreamConfig};

/// Mock LLM deployments (`POST /v1/chat/completions`, `/v1/embeddings`, `/v1/completions`,
/// `/v1/responses` and Anthropic's `/v1/messages`, each in its own format; `GET /v1/models`,
/// `GET /stats`) with a requests-per-minute limit, latency and injected failures.
#[derive(Debug, Parser)]
#[command(version, long_about = None)]
struct Args {
    /// A port to serve one deployment on (repeatable; 0 picks a free port). Without --port or
    /// --ports, one deployment on 9001.
    #[arg(long = "port", value_name = "PORT")]
    port: Vec<u16>,
    /// Comma-separated ports, one deployment each (e.g. 9001,9002,9003,9004); adds to --port.
    #[arg(long, value_name = "P1,P2,...", value_delimiter = ',')]
    ports: Vec<u16>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Requests allowed per window and deployment; past it, 429 with retry-after and OpenAI's
    /// rate_limit_exceeded body. Unlimited when not given.
    #[arg(long, value_name = "N")]
    rpm: Option<u64>,
    /// Length of the rate-limit window in seconds (fractions allowed); a window starts at the
    /// first request after the previous one ended.
    #[arg(long, value_name = "S", default_value_t = 60.0, value_parser = positive_secs)]
    window_secs: f64,
    /// Latency before each answer: none, fixed (--latency-ms), exp (exponential with mean
    /// --latency-ms) or uniform (between --latency-ms and --latency-max-ms).
    #[arg(long, value_enum, default_value_t = LatencyKind::None)]
    latency: LatencyKind,
    /// Latency in milliseconds: the fixed delay, the exponential mean, or the uniform minimum.
    #[arg(long, value_name = "MS")]
    latency_ms: Option<f64>,
    /// The uniform latency's maximum in milliseconds.
    #[arg(long, value_name = "MS")]
    latency_max_ms: Option<f64>,
    /// Probability (0 to 1) that an admitted request fails with --failure-status.
    #[arg(long, value_name = "P", default_value_t = 0.0, value_parser = probability)]
    failure_rate: f64,
    /// HTTP status of injected failures.
    #[arg(long, value_name = "S", default_value_t = 500,
          value_parser = clap::value_parser!(u16).range(400..=599))]
    failure_status: u16,
    /// Seed of the failure and latency draws; deployment i (in the order given) uses seed + i,
    /// so deployments fail independently, and the same way on every run.
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// The model the deployments answer as.
    #[arg(long, value_name = "NAME", default_value = "mock-model")]
    model: String,
    /// Send no retry-after and no x-ratelimit-* headers: a 429 says nothing of when to come
    /// back (for comparing with routers that ignore them).
    #[arg(long)]
    no_rate_limit_headers: bool,
    /// Answer with N words instead of the default sentence, so a stream has N content chunks
    /// (plus its role, finish and usage chunks): e.g. 50 for a realistic stream in benches.
    #[arg(long, value_name = "N")]
    stream_chunks: Option<usize>,
    /// Milliseconds between a stream's events (the first is sent at once): slow streams, as a
    /// model generating, for benches of many open streams (benches/streams.sh).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    stream_event_gap_ms: u64,
    /// Send, on every successful answer, the other headers OpenAI sends on one (request id,
    /// processing time, organization, Cloudflare's): a real answer's head, for benches.
    #[arg(long)]
    provider_headers: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LatencyKind {
    /// No delay.
    None,
    /// Always --latency-ms.
    Fixed,
    /// Exponential with mean --latency-ms.
    Exp,
    /// Uniform between --latency-ms and --latency-max-ms.
    Uniform,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

fn probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a probability between 0 and 1")),
    }
}

fn millis(name: &str, ms: Option<f64>) -> Result<Duration, String> {
    let ms = ms.ok_or_else(|| format!("--{name} is needed for this --latency"))?;
    Duration::try_from_secs_f64(ms / 1000.0)
        .map_err(|_| format!("--{name} {ms} is not a duration in milliseconds"))
}

impl Args {
    fn latency(&self) -> Result<Latency, String> {
        Ok(match self.latency {
            LatencyKind::None => Latency::None,
            LatencyKind::Fixed => Latency::Fixed(millis("latency-ms", self.latency_ms)?),
            LatencyKind::Exp => Latency::Exponential {
                mean: millis("latency-ms", self.latency_ms)?,
            },
            LatencyKind::Uniform => Latency::Uniform {
                min: millis("latency-ms", self.latency_ms)?,
                max: millis("latency-max-ms", self.latency_max_ms)?,
            },
        })
    }

    /// --port then --ports, duplicates dropped (one port cannot serve two deployments).
    fn all_ports(&self) -> Vec<u16> {
        let mut ports = Vec::new();
        for &p in self.port.iter().chain(&self.ports) {
            if p == 0 || !ports.contains(&p) {
                ports.push(p);
            }
        }
        if ports.is_empty() {
            ports.push(9001);
        }
        ports
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    gateway_example::logging::init("warn", gateway_example::logging::Output::Stderr);
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock-upstream: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let latency = args.latency()?;
    let mut deployments = Vec::new();
    for (i, port) in args.all_ports().into_iter().enumerate() {
        let config = MockUpstreamConfig {
            rpm: args.rpm,
            window: Duration::from_secs_f64(args.window_secs),
            latency,
            failure_rate: args.failure_rate,
            failure_status: args.failure_status,
            seed: args.seed.wrapping_add(i as u64),
            model: args.model.clone(),
            rate_limit_headers: !args.no_rate_limit_headers,
            provider_headers: args.provider_headers,
            event_gap: Duration::from_millis(args.stream_event_gap_ms),
            content: match args.stream_chunks {
                Some(n) => "word ".repeat(n),
                None => mock_upstream::CONTENT.to_owned(),
            },
        };
        let addr = SocketAddr::new(args.host, port);
        let deployment = MockUpstream::start_on(addr, config)
            .map_err(|e| format!("listening on {addr}: {e}"))?;
        deployments.push(deployment);
    }
    // Listened for before the lines below (what scripts wait for), so no signal is lost.
    let shutdown = shutdown_signal();
    // Printed only once every port listens, so a script may start sending after the last line.
    let mut out = std::io::stdout().lock();
    for d in &deployments {
        writeln!(out, "{}", d.url()).map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())?;
    drop(out);

    // SIGINT or SIGTERM. Dropping the deployments afterwards cuts open connections: a mock has
    // no work worth finishing.
    shutdown.await;
    for d in &deployments {
        let s = d.stats();
        eprintln!(
            "{}: received {} ok {} rate_limited {} failed {} bad_requests {} max_in_flight {}",
            d.url(),
            s.received,
            s.ok,
            s.rate_limited,
            s.failed,
            s.bad_requests,
            s.max_in_flight
        );
    }
    Ok(())
}
