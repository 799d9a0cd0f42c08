//! What `just bench-drain` prints: the table of every setting (medians,
//! ratios to the floor, where our time goes) and the soak's RSS curve.

use std::time::Duration;

use super::{Measured, NAMESPACES, Run, Who};

/// Each agent's RSS before its 1st, 2nd, … drain, at a few checkpoints,
/// and the growth per drain after the first (least squares).
pub fn print_curve(curve: &[Vec<u64>; 2]) {
    println!();
    println!("RSS of each agent before its n-th drain (MiB):");
    println!("| drain n | agent A | agent B |");
    println!("|---------|---------|---------|");
    let len = curve[0].len().max(curve[1].len());
    const CHECKPOINTS: [usize; 13] = [1, 2, 3, 5, 10, 15, 20, 30, 40, 50, 75, 100, 150];
    for n in CHECKPOINTS {
        if n <= len {
            let at = |c: &Vec<u64>| {
                c.get(n - 1)
                    .map(|k| format!("{:>7.2}", *k as f64 / 1024.0))
                    .unwrap_or_else(|| "      –".into())
            };
            println!("| {n:>7} | {} | {} |", at(&curve[0]), at(&curve[1]));
        }
    }
    if len > 0 && !CHECKPOINTS.contains(&len) {
        let last = |c: &Vec<u64>| {
            c.last()
                .map(|k| format!("{:>7.2}", *k as f64 / 1024.0))
                .unwrap_or_default()
        };
        println!("| {len:>7} | {} | {} |", last(&curve[0]), last(&curve[1]));
    }
    for (i, c) in curve.iter().enumerate() {
        // From the second drain on: the first one warms caches and pools.
        let pts: Vec<(f64, f64)> = c
            .iter()
            .enumerate()
            .skip(1)
            .map(|(x, y)| (x as f64, *y as f64))
            .collect();
        if pts.len() >= 3 {
            let n = pts.len() as f64;
            let (sx, sy) = pts.iter().fold((0.0, 0.0), |a, p| (a.0 + p.0, a.1 + p.1));
            let (mx, my) = (sx / n, sy / n);
            let cov: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
            let var: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
            println!(
                "agent {}: {:+.1} KiB per drain after the first ({} drains)",
                ["A", "B"][i],
                cov / var,
                c.len()
            );
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The median of `v` with an interval that holds the true median with at
/// least 90 % confidence, from order statistics alone (no assumption about
/// the rounds' spread, which is wide and skewed here): the k-th smallest
/// and k-th largest value, k as large as keeps that coverage. `None` below
/// 5 values, where even the smallest and largest cover less than 90 %.
fn median_interval(mut v: Vec<f64>) -> Option<(f64, f64, f64)> {
    let n = v.len();
    if n < 5 {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    // P(Binomial(n, 1/2) <= j), summed term by term.
    let below = |j: usize| -> f64 {
        let (mut term, mut sum) = (0.5f64.powi(n as i32), 0.0);
        for i in 0..=j {
            sum += term;
            term = term * (n - i) as f64 / (i + 1) as f64;
        }
        sum
    };
    let mut k = 1;
    while k < n / 2 && 1.0 - 2.0 * below(k) >= 0.9 {
        k += 1;
    }
    Some((v[n / 2], v[k - 1], v[n - k]))
}

/// Whether a paired ratio's interval settles a target of at most `limit`.
fn verdict(lo: f64, hi: f64, limit: f64) -> &'static str {
    if hi <= limit {
        "met"
    } else if lo > limit {
        "missed"
    } else {
        "undecided at these rounds"
    }
}

pub fn print_table(results: &[Measured], bin: &std::path::Path, runs: usize) {
    println!();
    println!(
        "drain benchmark: 110 evictable pods (10 Deployments, {NAMESPACES} namespaces), median of {runs} runs per setting"
    );
    println!("binary: {}", bin.display());
    println!(
        "targets: cordon ≤ 100 ms, Succeeded ≤ 2000 ms and ≤ 1.15 × the floor's last pod gone, RSS ≤ 10 MiB"
    );
    println!(
        "÷ floor: the setting's median over the floor's; paired: the median of each round's Succeeded over that round's floor; ÷ protocol: Succeeded's median over the protocol's (the writes every NMO-compatible drain makes, nothing decided)"
    );
    println!(
        "ours: to first eviction (the drainer's first request on the maintenance to its first eviction, API server's clock) and Succeeded − last pod gone (the status write after the drain)"
    );
    println!(
        "| setting                       | cordon    | last pod gone | ÷ floor | Succeeded | ÷ floor | paired | ÷ protocol | to first eviction | Succeeded − last pod gone | idle RSS  | peak RSS  | requests | CPU per drain | pod watches reopened |"
    );
    println!(
        "|-------------------------------|-----------|---------------|---------|-----------|---------|--------|------------|-------------------|---------------------------|-----------|-----------|----------|---------------|----------------------|"
    );
    let ms = |m: &Measured, f: fn(&Run) -> Duration| {
        median(m.rows.iter().map(|r| f(r).as_secs_f64() * 1e3).collect())
    };
    let floor = results
        .iter()
        .find(|m| m.who == Who::Floor)
        .map(|m| ms(m, |r| r.last_pod_gone));
    let ratio = |v: f64| floor.map_or("–".to_string(), |f| format!("{:.2}", v / f));
    let protocol = results
        .iter()
        .find(|m| m.who == Who::Protocol)
        .map(|m| ms(m, |r| r.drained));
    // The floor moves with the shared machine from round to round (420–710
    // ms in one batch); each round runs every setting once, so a setting's
    // Succeeded over the same round's floor compares like with like.
    let floor_rows = results
        .iter()
        .find(|m| m.who == Who::Floor)
        .map(|m| &m.rows);
    // A setting's Succeeded over the same round's `f` of `base`.
    let per_round = |m: &Measured, base: &[Run], f: fn(&Run) -> Duration| -> Vec<f64> {
        m.rows
            .iter()
            .zip(base)
            .map(|(r, b)| r.drained.as_secs_f64() / f(b).as_secs_f64())
            .collect()
    };
    let paired = |m: &Measured| {
        let ratios: Vec<f64> = floor_rows
            .map(|f| per_round(m, f, |r| r.last_pod_gone))
            .unwrap_or_default();
        if m.who == Who::Floor || ratios.is_empty() {
            "–".to_string()
        } else {
            format!("{:.2}", median(ratios))
        }
    };
    for m in results {
        let (cordon, gone, drained) = (
            ms(m, |r| r.cordon),
            ms(m, |r| r.last_pod_gone),
            ms(m, |r| r.drained),
        );
        let requests = median(m.rows.iter().map(|r| r.requests as f64).collect());
        let reopened: usize = m.rows.iter().map(|r| r.pod_watches).sum();
        let cpu = if m.who.bench_drains() {
            "–".to_string()
        } else {
            format!(
                "{:.1} ms",
                median(m.rows.iter().map(|r| r.cpu_ms).collect())
            )
        };
        let mib = |k: u64| {
            if m.who.bench_drains() {
                "–".to_string()
            } else {
                format!("{:.1} MiB", k as f64 / 1024.0)
            }
        };
        let (cordon, drained_s) = if m.who == Who::Floor {
            ("–".to_string(), "–".to_string())
        } else {
            (format!("{cordon:.1} ms"), format!("{drained:.0} ms"))
        };
        let heads: Vec<f64> = m
            .rows
            .iter()
            .filter_map(|r| r.to_first_eviction)
            .map(|d| d.as_secs_f64() * 1e3)
            .collect();
        let head = if heads.is_empty() {
            "–".to_string()
        } else {
            format!("{:.1} ms", median(heads))
        };
        let tail = if m.who == Who::Floor {
            "–".to_string()
        } else {
            let after: Vec<f64> = m
                .rows
                .iter()
                .map(|r| (r.drained.as_secs_f64() - r.last_pod_gone.as_secs_f64()) * 1e3)
                .collect();
            format!("{:.1} ms", median(after))
        };
        println!(
            "| {:<29} | {cordon:>9} | {gone:>10.0} ms | {:>7} | {drained_s:>9} | {:>7} | {:>6} | {:>10} | {head:>17} | {tail:>25} | {:>9} | {:>9} | {requests:>8.0} | {cpu:>13} | {reopened:>3} in {} runs |",
            m.label,
            ratio(gone),
            if m.who == Who::Floor {
                "–".to_string()
            } else {
                ratio(drained)
            },
            paired(m),
            match protocol {
                Some(p) if m.who != Who::Floor => format!("{:.2}", drained / p),
                _ => "–".to_string(),
            },
            mib(m.idle_rss),
            mib(m.peak_rss),
            m.rows.len(),
        );
    }

    print_costs(results);

    // Each round's Succeeded over the same round's floor (and protocol),
    // with the median's 90 % interval: the rounds here spread by a third
    // or more, so a median alone cannot say whether 1.15 is met.
    let protocol_rows = results
        .iter()
        .find(|m| m.who == Who::Protocol)
        .map(|m| &m.rows);
    println!();
    println!(
        "paired, each with the median's 90 % interval (order statistics) and the target Succeeded ≤ 1.15 × the floor:"
    );
    for m in results.iter().filter(|m| m.who != Who::Floor) {
        let floor = floor_rows
            .and_then(|f| median_interval(per_round(m, f, |r| r.last_pod_gone)))
            .map_or("–".to_string(), |(med, lo, hi)| {
                format!("{med:.2} ({lo:.2}–{hi:.2}): {}", verdict(lo, hi, 1.15))
            });
        let protocol = protocol_rows
            .filter(|_| m.who != Who::Protocol)
            .and_then(|p| median_interval(per_round(m, p, |r| r.drained)))
            .map_or("–".to_string(), |(med, lo, hi)| {
                format!("{med:.2} ({lo:.2}–{hi:.2})")
            });
        println!("  {:<29} ÷ floor {floor}; ÷ protocol {protocol}", m.label);
    }
}

/// What each drain cost, per setting: requests, the drainer's CPU, the API
/// server's CPU and the bytes the drainer exchanged (medians, the CPU
/// figures with their 90 % intervals), and the targets against the
/// protocol and NMO, judged on the intervals (met only when they do not
/// overlap the bound). Counts, not times: two shared cores blur the wall
/// clock far more than these. The API server's CPU includes what every
/// drain causes whoever drains (the ReplicaSets' new pods, kwok's status
/// writes): the floor's row is that share.
fn print_costs(results: &[Measured]) {
    let med = |m: &Measured, f: fn(&Run) -> f64| median(m.rows.iter().map(f).collect());
    let interval =
        |m: &Measured, f: fn(&Run) -> f64| median_interval(m.rows.iter().map(f).collect());
    let cpu = |r: &Run| r.cpu_ms;
    let api = |r: &Run| r.apiserver_cpu_ms;
    let protocol_requests = results
        .iter()
        .find(|m| m.who == Who::Protocol)
        .map(|m| med(m, |r| r.requests as f64));
    let nmo = results.iter().find(|m| m.label.starts_with("medik8s"));
    // Ours (lo, hi) against a bound (lo, hi) scaled by `k`.
    let judge = |ours: Option<(f64, f64, f64)>, theirs: Option<(f64, f64, f64)>, k: f64| match (
        ours, theirs,
    ) {
        (Some((_, _, hi)), Some((_, tlo, _))) if hi <= tlo * k => "met",
        (Some((_, lo, _)), Some((_, _, thi))) if lo > thi * k => "NOT met",
        (Some(_), Some(_)) => "undecided",
        _ => "–",
    };
    println!();
    println!(
        "costs per drain (medians; targets: requests ≤ the protocol's + 5, CPU ≤ ½ NMO's, the API server's CPU ≤ NMO's, judged on the 90 % intervals):"
    );
    println!(
        "| setting                       | requests | drainer CPU (90 % interval) | API server CPU (90 % interval) | bytes exchanged | targets |"
    );
    println!(
        "|-------------------------------|----------|-----------------------------|--------------------------------|-----------------|---------|"
    );
    let show = |i: Option<(f64, f64, f64)>| {
        i.map_or("–".to_string(), |(v, lo, hi)| {
            format!("{v:.1} ms ({lo:.1}–{hi:.1})")
        })
    };
    for m in results {
        let requests = med(m, |r| r.requests as f64);
        let ours = !m.who.bench_drains();
        let bytes = if ours {
            format!("{:.0} KiB", med(m, |r| r.bytes as f64) / 1024.0)
        } else {
            "–".to_string()
        };
        let mut verdicts = Vec::new();
        if ours && !m.label.starts_with("medik8s") {
            if let Some(p) = protocol_requests {
                let met = if requests <= p + 5.0 {
                    "met"
                } else {
                    "NOT met"
                };
                verdicts.push(format!("requests {met}"));
            }
            if let Some(n) = nmo {
                let c = judge(interval(m, cpu), interval(n, cpu), 0.5);
                let a = judge(interval(m, api), interval(n, api), 1.0);
                verdicts.push(format!("CPU {c}, API server {a}"));
            }
        }
        println!(
            "| {:<29} | {requests:>8.0} | {:>27} | {:>30} | {bytes:>15} | {} |",
            m.label,
            if ours {
                show(interval(m, cpu))
            } else {
                "–".to_string()
            },
            show(interval(m, api)),
            if verdicts.is_empty() {
                "–".to_string()
            } else {
                verdicts.join(", ")
            },
        );
    }
}
