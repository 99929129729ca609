//! `inferno play` without a model: choose one of the cached models by number.

use crate::commands::list;
use crate::error::{ErrorKind, fail};
use crate::hub::Cache;

pub fn pick() -> anyhow::Result<String> {
    let cache = Cache::from_env();
    let rows = list::collect(&cache)?;
    let mut ids: Vec<String> =
        rows.iter().filter(|r| r.info.is_ok()).map(|r| r.model.clone()).collect();
    ids.dedup();
    if ids.is_empty() {
        return Err(fail(
            ErrorKind::NotFound,
            format!(
                "no models in {}; download one first, e.g. inferno download HuggingFaceTB/SmolLM2-135M-Instruct",
                cache.root().display()
            ),
        ));
    }
    eprintln!("Cached models:");
    for (i, id) in ids.iter().enumerate() {
        eprintln!("  {:>2}. {id}", i + 1);
    }
    let mut editor = rustyline::DefaultEditor::new()?;
    loop {
        let line = match editor.readline(&format!("model [1-{}]: ", ids.len())) {
            Ok(l) => l,
            Err(_) => return Err(fail(ErrorKind::InvalidInput, "no model chosen")),
        };
        match line.trim().parse::<usize>() {
            Ok(n) if (1..=ids.len()).contains(&n) => return Ok(ids[n - 1].clone()),
            _ => eprintln!("type a number from 1 to {}", ids.len()),
        }
    }
}
