//! The promise of this crate, checked: what `libttrace.so` links (the normal dependencies of
//! `ttrace-intercept`, followed through the workspace manifests and `Cargo.lock`) holds no
//! compression and no JSON crate, and not the store crate. What `cargo tree -p
//! ttrace-intercept -e normal` shows, without needing cargo at test time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crates the preload must not link: compression, JSON, the store.
const FORBIDDEN: &[&str] = &[
    "zstd",
    "zstd-safe",
    "zstd-sys",
    "serde_json",
    "flate2",
    "miniz_oxide",
    "lz4",
    "lz4_flex",
    "brotli",
    "snap",
    "xz2",
    "bzip2",
    "ttrace-format",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("proto/ is in the workspace")
        .to_path_buf()
}

/// The keys of one `[section]` of a manifest (`name.workspace = true`, `name = ...`).
fn section_keys(manifest: &str, section: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            let key = line.split(['=', '.']).next().unwrap_or("").trim();
            keys.push(key.trim_matches('"').to_string());
        }
    }
    keys
}

/// Workspace crates by name: the directory of each path dependency of the root manifest.
fn workspace_crates(root: &Path) -> BTreeMap<String, PathBuf> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("root manifest");
    let mut out = BTreeMap::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[workspace.dependencies]";
            continue;
        }
        let Some((name, rest)) = line.split_once('=') else {
            continue;
        };
        let path = rest
            .split("path = \"")
            .nth(1)
            .and_then(|p| p.split('"').next());
        if let (true, Some(p)) = (inside, path) {
            out.insert(name.trim().to_string(), root.join(p));
        }
    }
    out
}

/// Each package of `Cargo.lock` with the names of its dependencies.
fn lock_graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).expect("Cargo.lock");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut name = String::new();
    let mut in_deps = false;
    for line in lock.lines().map(str::trim) {
        if line == "[[package]]" {
            in_deps = false;
        } else if let Some(n) = line.strip_prefix("name = ") {
            name = n.trim_matches('"').to_string();
            out.entry(name.clone()).or_default();
        } else if line == "dependencies = [" {
            in_deps = true;
        } else if line == "]" {
            in_deps = false;
        } else if in_deps {
            // `"name"` or `"name version"` when several versions are locked.
            let dep = line
                .trim_matches([',', '"'])
                .split(' ')
                .next()
                .unwrap_or("");
            out.entry(name.clone()).or_default().insert(dep.to_string());
        }
    }
    out
}

/// Every crate the crate in `dir` links: workspace crates through their `[dependencies]`,
/// the others through `Cargo.lock` (which lists no dev-dependencies of registry crates).
fn linked_by(dir: &Path) -> BTreeSet<String> {
    let root = workspace_root();
    let members = workspace_crates(&root);
    let lock = lock_graph(&root);
    let direct = |dir: &Path| {
        let m = std::fs::read_to_string(dir.join("Cargo.toml")).expect("member manifest");
        section_keys(&m, "dependencies")
    };
    let mut seen = BTreeSet::new();
    let mut todo = direct(dir);
    while let Some(c) = todo.pop() {
        if !seen.insert(c.clone()) {
            continue;
        }
        match members.get(&c) {
            Some(d) => todo.extend(direct(d)),
            None => todo.extend(lock.get(&c).into_iter().flatten().cloned()),
        }
    }
    seen
}

#[test]
fn the_preload_links_no_compression_no_json_and_not_the_store() {
    let linked = linked_by(&workspace_root().join("intercept"));
    // Not vacuous: the walk reached the vocabulary and what it needs.
    for needed in ["ttrace-proto", "cuda-abi", "ciborium", "serde", "libc"] {
        assert!(linked.contains(needed), "{needed} not found in {linked:?}");
    }
    let bad: Vec<&&str> = FORBIDDEN.iter().filter(|f| linked.contains(**f)).collect();
    assert!(bad.is_empty(), "libttrace.so links {bad:?}");
}

#[test]
fn the_walk_sees_the_compression_the_store_crate_links() {
    let linked = linked_by(&workspace_root().join("format"));
    assert!(
        linked.contains("zstd-sys") && linked.contains("serde_json"),
        "{linked:?}"
    );
}
