//! `sim`: runs the study's experiments on the real limiter and router and prints their tables
//! (Markdown, in the study's layout) or JSON, and writes the plots.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use serde_json::{json, Map, Value};
use sim::{accounting, cascade, plot, replay, retries, routing, scheduler, worked_example};

/// Which experiment to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Experiment {
    /// Goodput at and beyond capacity: the source's remove-for-a-minute policy vs ours.
    Cascade,
    /// Waits per routing strategy, one gateway and four independent ones.
    Routing,
    /// Calls multiplier and failures left, independent and correlated failures.
    Retries,
    /// The worked example (docs/behaviour.md, "A worked example") on the real limiter.
    WorkedExample,
    /// Token accounting: post_hoc and reserve, fixed and sliding windows.
    Accounting,
    /// The queue against an immediate 429 with retries: load, fairness, floors, memory.
    Scheduler,
    /// All of the above.
    All,
}

/// Runs the source study and the worked example (docs/behaviour.md, "A worked example") on the
/// real limiter and router. `sim replay TRACE --config C.yaml [--against D.yaml]` replays a
/// request record instead (`sim replay --help`).
#[derive(Debug, Parser)]
#[command(name = "sim", version)]
struct Args {
    /// The experiment.
    experiment: Experiment,
    /// Seed of every random stream: the same seed prints the same numbers.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// A short run (30 minutes of cascade, 450 s of routing, 20,000 requests per retry cell),
    /// as the tests use. Writes no plots unless `--plots` is given.
    #[arg(long)]
    quick: bool,
    /// Where to write the SVG plots (default: the workspace's `docs/`, full runs only).
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Write no plots.
    #[arg(long, conflicts_with = "plots")]
    no_plots: bool,
}

/// `sim replay`: a request record (`general_settings.record`) run through the gateway's routing
/// (group limiter, router, retries, fallbacks, key and team limits) of one or two gateway configs
/// in virtual time (see `sim::replay`).
#[derive(Debug, Parser)]
#[command(name = "sim replay", version)]
struct ReplayArgs {
    /// The record: one JSON line a request.
    trace: PathBuf,
    /// The gateway config to try (a LiteLLM `config.yaml`, read as the gateway reads it).
    #[arg(long)]
    config: PathBuf,
    /// A second config (the one in force) to show beside it.
    #[arg(long)]
    against: Option<PathBuf>,
    /// The keys' and teams' limits, by the record's key hash and team id (JSON; see
    /// `sim::replay::Callers`). Without it no key or team has limits.
    #[arg(long)]
    callers: Option<PathBuf>,
    /// Write the plot (saturation and per-priority use over time, each config) to this SVG.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

fn run_replay(args: ReplayArgs) -> Result<(), String> {
    let trace = replay::read_trace(&args.trace)?;
    let callers = match &args.callers {
        Some(path) => replay::Callers::read(path)?,
        None => replay::Callers::default(),
    };
    let started = Instant::now();
    let mut configs = vec![(
        args.config.display().to_string(),
        replay::read_policy(&args.config)?,
    )];
    if let Some(against) = &args.against {
        configs.push((against.display().to_string(), replay::read_policy(against)?));
    }
    let runs: Vec<(String, replay::Replayed)> = configs
        .iter()
        .map(|(name, config)| (name.clone(), replay::replay(&trace, config, &callers)))
        .collect();
    let recording = replay::recorded(&trace);
    if let Some((_, run)) = runs.first() {
        eprintln!(
            "{} request(s) from {} gateway process(es): {}",
            trace.len(),
            run.gateways.len(),
            run.gateways.join(", ")
        );
    }
    if let Some(svg) = &args.svg {
        let span = match (trace.first(), trace.last()) {
            (Some(a), Some(b)) => b.time_ms - a.time_ms + 1,
            _ => 1,
        };
        let timelines: Vec<replay::Timeline> = runs
            .iter()
            .zip(&configs)
            .map(|((_, run), (_, config))| replay::timeline(run, config, span, 120))
            .collect();
        let named: Vec<(&str, &replay::Timeline)> = runs
            .iter()
            .zip(&timelines)
            .map(|((name, _), t)| (name.as_str(), t))
            .collect();
        let path = plot::replay(&named, svg).map_err(|e| format!("plot: {e}"))?;
        eprintln!("wrote {}", path.display());
    }
    if args.json {
        let rows = |report: &replay::Report| -> Vec<Value> {
            report
                .iter()
                .map(|(k, r)| json!({"key": k, "row": r}))
                .collect()
        };
        let mut out = Map::new();
        out.insert("recorded".into(), Value::Array(rows(&recording)));
        for (name, run) in &runs {
            out.insert(
                name.clone(),
                json!({"rows": rows(&run.report), "deployments": run.deployments,
                       "stand_in_costs": run.stand_in_costs, "gateways": run.gateways}),
            );
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&Value::Object(out)).expect("JSON of plain data")
        );
    } else {
        let named: Vec<(&str, &replay::Replayed)> =
            runs.iter().map(|(n, r)| (n.as_str(), r)).collect();
        println!("{} requests from {}\n", trace.len(), args.trace.display());
        print!("{}", replay::render(&recording, &named));
    }
    eprintln!("replayed in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("replay") {
        let args = ReplayArgs::parse_from(
            std::iter::once("sim replay".to_owned()).chain(std::env::args().skip(2)),
        );
        if let Err(e) = run_replay(args) {
            eprintln!("{e}");
            std::process::exit(1);
        }
        return;
    }
    let args = Args::parse();
    let plots = if args.no_plots {
        None
    } else {
        match (&args.plots, args.quick) {
            (Some(dir), _) => Some(dir.clone()),
            // Quick runs must not overwrite the committed plots of a full run.
            (None, true) => None,
            (None, false) => Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs")),
        }
    };
    let plots = plots.map(|dir| {
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("cannot create {}: {e}", dir.display());
            std::process::exit(1);
        }
        dir.canonicalize().unwrap_or(dir)
    });
    let wants = |e: Experiment| args.experiment == e || args.experiment == Experiment::All;
    let mut json = Map::new();
    let mut text = String::new();
    let mut written = Vec::new();
    let mut plotted = |result: plot::PlotResult| match result {
        Ok(path) => written.push(path),
        Err(e) => {
            eprintln!("plot failed: {e}");
            std::process::exit(1);
        }
    };
    let started = Instant::now();

    if wants(Experiment::Cascade) {
        let params = if args.quick {
            cascade::Params::quick(args.seed)
        } else {
            cascade::Params::full(args.seed)
        };
        let report = cascade::run(&params);
        text.push_str(&cascade::render(&report));
        text.push('\n');
        if let Some(dir) = &plots {
            plotted(plot::cascade(&report, dir));
        }
        json.insert("cascade".into(), to_value(&report));
    }
    if wants(Experiment::Routing) {
        let params = if args.quick {
            routing::Params::quick(args.seed)
        } else {
            routing::Params::full(args.seed)
        };
        let report = routing::run(&params);
        text.push_str(&routing::render(&report));
        text.push('\n');
        if let Some(dir) = &plots {
            plotted(plot::routing(&report, dir));
        }
        json.insert("routing".into(), to_value(&report));
    }
    if wants(Experiment::Retries) {
        let params = if args.quick {
            retries::Params::quick(args.seed)
        } else {
            retries::Params::full(args.seed)
        };
        let report = retries::run(&params);
        text.push_str(&retries::render(&report));
        text.push('\n');
        json.insert("retries".into(), to_value(&report));
    }
    if wants(Experiment::WorkedExample) {
        let report = worked_example::run();
        text.push_str(&worked_example::render(&report));
        text.push('\n');
        if let Some(dir) = &plots {
            plotted(plot::worked_example(&report, dir));
        }
        json.insert("worked_example".into(), to_value(&report));
    }
    if wants(Experiment::Accounting) {
        let report = accounting::run(args.seed);
        text.push_str(&accounting::render(&report));
        text.push('\n');
        json.insert("accounting".into(), to_value(&report));
    }

    if wants(Experiment::Scheduler) {
        let report = scheduler::run(args.seed, args.quick);
        text.push_str(&scheduler::render(&report));
        text.push('\n');
        json.insert("scheduler".into(), to_value(&report));
    }

    if args.json {
        json.insert(
            "run".into(),
            json!({"seed": args.seed, "quick": args.quick}),
        );
        println!(
            "{}",
            serde_json::to_string_pretty(&Value::Object(json)).expect("JSON of plain data")
        );
    } else {
        print!("{text}");
    }
    // Timing and file names go to stderr, so stdout stays the same for the same seed.
    for path in &written {
        eprintln!("wrote {}", path.display());
    }
    eprintln!("ran in {:.1} s", started.elapsed().as_secs_f64());
}

fn to_value(report: &impl serde::Serialize) -> Value {
    serde_json::to_value(report).expect("JSON of plain data")
}
