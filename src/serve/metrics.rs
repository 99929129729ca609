//! `GET /metrics` in the Prometheus text format: request counts by endpoint and status, token
//! counters, the engine's running and waiting sequences, its batch size and free KV blocks
//! (from [`Engine::stats`](crate::engine::core::Engine::stats)), and histograms of the time
//! to first token and the time between tokens. Counters are atomics, so recording costs the
//! request path nothing worth measuring.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::engine::core::EngineStats;

/// Bucket bounds in seconds.
const TTFT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const ITL_BOUNDS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56];

pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), the last one for +Inf.
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.iter().position(|&b| s <= b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }
}

pub struct Metrics {
    /// (endpoint, status) → requests answered.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// finish_reason → generations that ended so.
    finishes: Mutex<BTreeMap<&'static str, u64>>,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Generations stopped because the client went away.
    pub cancelled: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::default(),
            finishes: Mutex::default(),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            itl: Histogram::new(ITL_BOUNDS),
        }
    }
}

/// What `/metrics` reads besides the counters.
pub struct Gauges {
    pub loaded: bool,
    pub engine: Option<EngineStats>,
    /// Requests admitted by the server and not yet answered (running, waiting, streaming).
    pub in_flight: usize,
}

impl Metrics {
    pub fn count_request(&self, endpoint: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint.to_string(), status)).or_default() += 1;
        }
    }

    pub fn count_finish(&self, reason: &'static str) {
        if let Ok(mut m) = self.finishes.lock() {
            *m.entry(reason).or_default() += 1;
        }
    }

    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let _ = writeln!(
            out,
            "# HELP inferno_requests_total HTTP requests answered, by endpoint and status.\n# TYPE inferno_requests_total counter"
        );
        if let Ok(m) = self.requests.lock() {
            for ((endpoint, status), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "inferno_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP inferno_generations_total Generations finished, by finish_reason.\n# TYPE inferno_generations_total counter"
        );
        if let Ok(m) = self.finishes.lock() {
            for (reason, n) in m.iter() {
                let _ = writeln!(out, "inferno_generations_total{{reason=\"{reason}\"}} {n}");
            }
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            &mut out,
            "inferno_prompt_tokens_total",
            "Prompt tokens of finished generations.",
            load(&self.prompt_tokens),
        );
        counter(
            &mut out,
            "inferno_prompt_cached_tokens_total",
            "Prompt tokens served from the prefix cache.",
            load(&self.cached_tokens),
        );
        counter(
            &mut out,
            "inferno_generation_tokens_total",
            "Tokens generated.",
            load(&self.generated_tokens),
        );
        counter(
            &mut out,
            "inferno_cancelled_total",
            "Generations stopped because the client disconnected.",
            load(&self.cancelled),
        );
        let mut gauge = |name: &str, help: &str, v: String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            "inferno_model_loaded",
            "1 once the model is loaded.",
            u8::from(g.loaded).to_string(),
        );
        gauge(
            "inferno_requests_in_flight",
            "Requests admitted and not yet answered.",
            g.in_flight.to_string(),
        );
        if let Some(s) = &g.engine {
            gauge(
                "inferno_running_sequences",
                "Sequences the engine is running.",
                s.running.to_string(),
            );
            gauge(
                "inferno_waiting_sequences",
                "Sequences waiting for a slot or KV space.",
                s.waiting.to_string(),
            );
            gauge(
                "inferno_batch_size",
                "Sequences in the engine's last step.",
                s.last_batch.to_string(),
            );
            gauge("inferno_engine_steps", "Steps the engine has run.", s.steps.to_string());
            let _ = writeln!(
                out,
                "# HELP inferno_kv_free_blocks KV-cache blocks free, per layer group.\n# TYPE inferno_kv_free_blocks gauge"
            );
            for (i, b) in s.free_blocks.iter().enumerate() {
                let _ = writeln!(out, "inferno_kv_free_blocks{{group=\"{i}\"}} {b}");
            }
            let _ = writeln!(
                out,
                "# HELP inferno_kv_total_blocks KV-cache blocks in all, per layer group.\n# TYPE inferno_kv_total_blocks gauge"
            );
            for (i, b) in s.total_blocks.iter().enumerate() {
                let _ = writeln!(out, "inferno_kv_total_blocks{{group=\"{i}\"}} {b}");
            }
            // Speculative decoding (vLLM's names): acceptance rate = accepted / draft tokens,
            // mean accepted length = 1 + accepted / drafts.
            let spec = s.spec;
            counter(
                &mut out,
                "inferno_spec_decode_num_drafts",
                "Drafts verified (one sequence's draft in one step).",
                spec.drafts,
            );
            counter(
                &mut out,
                "inferno_spec_decode_num_draft_tokens",
                "Draft tokens verified.",
                spec.draft_tokens,
            );
            counter(
                &mut out,
                "inferno_spec_decode_num_accepted_tokens",
                "Draft tokens accepted.",
                spec.accepted_tokens,
            );
        }
        self.ttft.render(
            &mut out,
            "inferno_time_to_first_token_seconds",
            "From the request's arrival to its first token.",
        );
        self.itl.render(
            &mut out,
            "inferno_inter_token_latency_seconds",
            "Between consecutive tokens of a generation.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_text_is_prometheus() {
        let m = Metrics::default();
        m.ttft.observe(Duration::from_millis(5));
        m.ttft.observe(Duration::from_millis(300));
        m.ttft.observe(Duration::from_secs(100));
        m.count_request("/v1/chat/completions", 200);
        m.count_request("/v1/chat/completions", 200);
        m.count_finish("stop");
        let stats = EngineStats {
            running: 2,
            waiting: 1,
            free_blocks: vec![10, 20],
            total_blocks: vec![11, 21],
            steps: 5,
            last_batch: 2,
            ..EngineStats::default()
        };
        let text = m.render(&Gauges { loaded: true, engine: Some(stats), in_flight: 3 });
        assert!(
            text.contains("inferno_time_to_first_token_seconds_bucket{le=\"0.01\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("inferno_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("inferno_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("inferno_time_to_first_token_seconds_count 3\n"));
        assert!(text.contains(
            "inferno_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n"
        ));
        assert!(text.contains("inferno_kv_free_blocks{group=\"1\"} 20\n"));
        assert!(text.contains("inferno_running_sequences 2\n"));
        assert!(text.contains("inferno_generations_total{reason=\"stop\"} 1\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
