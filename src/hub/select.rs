//! Which files of a repository `inferno download` fetches.
//!
//! By default: the config and tokenizer files that exist, plus the weights — the safetensors
//! shards named by `model.safetensors.index.json` when it exists, else the top-level
//! `*.safetensors`, else the one top-level `*.gguf`. Only top-level files are defaults, which
//! skips the `original/` and `metal/` copies of gpt-oss weights. `--include` globs replace the
//! weight selection (config and tokenizer files still come); `--exclude` globs remove anything.

use std::collections::{BTreeSet, HashMap};

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::error::{ErrorKind, fail};
use crate::util::human_bytes;

/// Config, generation and tokenizer files fetched whenever the repo has them.
pub const ESSENTIAL_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
];

pub const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";

/// A file in the repo listing: path and size.
#[derive(Debug, Clone)]
pub struct Listed {
    pub path: String,
    pub size: u64,
}

/// Globs from the command line.
#[derive(Debug, Default, Clone)]
pub struct Filters {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

/// The shard file names listed in a `model.safetensors.index.json`: plain names of files
/// beside it. The loaders join each to the model folder, so a name with a path in it
/// (`../x`, `/dev/stdin`) would read a file outside it, or block on a pipe.
pub fn index_shards(index_json: &[u8]) -> anyhow::Result<BTreeSet<String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: HashMap<String, String>,
    }
    let index: Index = serde_json::from_slice(index_json).map_err(|e| {
        fail(ErrorKind::Integrity, format!("{SAFETENSORS_INDEX} is not valid: {e}"))
    })?;
    let shards: BTreeSet<String> = index.weight_map.into_values().collect();
    if let Some(bad) = shards.iter().find(|s| !is_plain_file_name(s)) {
        return Err(fail(
            ErrorKind::Integrity,
            format!("{SAFETENSORS_INDEX} names a shard {bad:?} outside the model's folder"),
        ));
    }
    Ok(shards)
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// Chooses the files to fetch. `shards` is the index's shard set when the repo has an index.
pub fn select(
    repo: &str,
    files: &[Listed],
    shards: Option<&BTreeSet<String>>,
    filters: &Filters,
) -> anyhow::Result<Vec<Listed>> {
    let include = build_globs(&filters.include)?;
    let exclude = build_globs(&filters.exclude)?;
    let top_level = |f: &&Listed| !f.path.contains('/');
    let mut chosen: BTreeSet<&str> = files
        .iter()
        .filter(top_level)
        .filter(|f| ESSENTIAL_FILES.contains(&f.path.as_str()) || f.path == SAFETENSORS_INDEX)
        .map(|f| f.path.as_str())
        .collect();

    let weights = if let Some(include) = include {
        files.iter().filter(|f| include.is_match(&f.path)).map(|f| f.path.as_str()).collect()
    } else {
        default_weights(repo, files, shards)?
    };
    chosen.extend(weights);

    let exclude = exclude.unwrap_or_else(GlobSet::empty);
    Ok(files
        .iter()
        .filter(|f| chosen.contains(f.path.as_str()) && !exclude.is_match(&f.path))
        .cloned()
        .collect())
}

fn default_weights<'a>(
    repo: &str,
    files: &'a [Listed],
    shards: Option<&BTreeSet<String>>,
) -> anyhow::Result<Vec<&'a str>> {
    if let Some(shards) = shards {
        for shard in shards {
            if !files.iter().any(|f| &f.path == shard) {
                return Err(fail(
                    ErrorKind::Integrity,
                    format!(
                        "{SAFETENSORS_INDEX} of {repo} names {shard}, which the repo does not have"
                    ),
                ));
            }
        }
        return Ok(files
            .iter()
            .filter(|f| shards.contains(&f.path))
            .map(|f| f.path.as_str())
            .collect());
    }
    let top = |ext: &str| -> Vec<&'a Listed> {
        files.iter().filter(|f| !f.path.contains('/') && f.path.ends_with(ext)).collect()
    };
    let safetensors = top(".safetensors");
    if !safetensors.is_empty() {
        return Ok(safetensors.into_iter().map(|f| f.path.as_str()).collect());
    }
    let ggufs = top(".gguf");
    match ggufs.len() {
        0 => Err(fail(ErrorKind::NotFound, format!("{repo} has no safetensors or GGUF weights"))),
        1 => Ok(vec![ggufs[0].path.as_str()]),
        _ => {
            let names: Vec<String> =
                ggufs.iter().map(|f| format!("{} ({})", f.path, human_bytes(f.size))).collect();
            Err(fail(
                ErrorKind::InvalidInput,
                format!(
                    "{repo} has {} GGUF files; choose with --include, e.g. --include '*Q4_K_M.gguf': {}",
                    ggufs.len(),
                    names.join(", ")
                ),
            ))
        }
    }
}

fn build_globs(patterns: &[String]) -> anyhow::Result<Option<GlobSet>> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut builder = GlobSetBuilder::new();
    for p in patterns {
        let glob = Glob::new(p)
            .map_err(|e| fail(ErrorKind::InvalidInput, format!("invalid glob {p:?}: {e}")))?;
        builder.add(glob);
    }
    Ok(Some(builder.build()?))
}

#[cfg(test)]
mod tests {
    #[test]
    fn index_shards_must_be_files_beside_the_index() {
        let index = |name: &str| serde_json::json!({"weight_map": {"w": name}}).to_string();
        let ok = super::index_shards(index("model-00001-of-00002.safetensors").as_bytes());
        assert_eq!(ok.unwrap().len(), 1);
        for bad in ["../secret.safetensors", "/dev/stdin", "a/b.safetensors", "..", "", "a\\b"] {
            let err = super::index_shards(index(bad).as_bytes()).unwrap_err();
            assert!(err.to_string().contains("outside the model's folder"), "{bad}: {err}");
        }
    }

    use super::*;

    fn listed(names: &[&str]) -> Vec<Listed> {
        names.iter().map(|n| Listed { path: n.to_string(), size: 10 }).collect()
    }

    fn paths(v: &[Listed]) -> Vec<&str> {
        v.iter().map(|f| f.path.as_str()).collect()
    }

    const GPT_OSS: &[&str] = &[
        ".gitattributes",
        "LICENSE",
        "README.md",
        "USAGE_POLICY",
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "metal/model.bin",
        "model-00000-of-00002.safetensors",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "original/config.json",
        "original/dtypes.json",
        "original/model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ];

    #[test]
    fn gpt_oss_skips_original_and_metal() {
        let files = listed(GPT_OSS);
        let shards: BTreeSet<String> =
            (0..3).map(|i| format!("model-0000{i}-of-00002.safetensors")).collect();
        let got = select("openai/gpt-oss-20b", &files, Some(&shards), &Filters::default()).unwrap();
        assert_eq!(
            paths(&got),
            vec![
                "chat_template.jinja",
                "config.json",
                "generation_config.json",
                "model-00000-of-00002.safetensors",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json",
                "special_tokens_map.json",
                "tokenizer.json",
                "tokenizer_config.json",
            ]
        );
    }

    #[test]
    fn index_decides_the_shards() {
        let files = listed(&[
            "config.json",
            "model.safetensors.index.json",
            "a.safetensors",
            "b.safetensors",
            "consolidated.safetensors",
        ]);
        let shards: BTreeSet<String> =
            ["a.safetensors".to_string(), "b.safetensors".to_string()].into();
        let got = select("x/y", &files, Some(&shards), &Filters::default()).unwrap();
        assert_eq!(
            paths(&got),
            vec!["config.json", "model.safetensors.index.json", "a.safetensors", "b.safetensors"]
        );
        let missing: BTreeSet<String> = ["c.safetensors".to_string()].into();
        assert!(select("x/y", &files, Some(&missing), &Filters::default()).is_err());
    }

    #[test]
    fn gguf_needs_include_when_ambiguous() {
        let files = listed(&["README.md", "m.Q4_0.gguf", "m.Q8_0.gguf"]);
        let err = select("x/y", &files, None, &Filters::default()).unwrap_err();
        assert!(err.to_string().contains("--include"), "{err}");
        let f = Filters { include: vec!["*Q8_0.gguf".into()], exclude: vec![] };
        assert_eq!(paths(&select("x/y", &files, None, &f).unwrap()), vec!["m.Q8_0.gguf"]);
        let single = listed(&["m.Q4_0.gguf", "config.json"]);
        assert_eq!(
            paths(&select("x/y", &single, None, &Filters::default()).unwrap()),
            vec!["m.Q4_0.gguf", "config.json"]
        );
    }

    #[test]
    fn exclude_removes_anything() {
        let files = listed(&["config.json", "tokenizer.json", "model.safetensors"]);
        let f = Filters { include: vec![], exclude: vec!["tokenizer*".into()] };
        assert_eq!(
            paths(&select("x/y", &files, None, &f).unwrap()),
            vec!["config.json", "model.safetensors"]
        );
    }

    #[test]
    fn no_weights_is_an_error() {
        let files = listed(&["config.json", "pytorch_model.bin"]);
        assert!(select("x/y", &files, None, &Filters::default()).is_err());
        assert!(build_globs(&["[".to_string()]).is_err());
    }
}
