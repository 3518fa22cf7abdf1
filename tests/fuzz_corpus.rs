//! The fuzz targets' bodies run on stable over their saved corpora (`fuzz/corpus/<target>/`), so
//! `make test` replays every input the fuzzer kept without nightly or libFuzzer. The bodies and
//! seeds are the fuzz crate's own files, compiled here as modules.

#[path = "../fuzz/src/bodies.rs"]
mod bodies;
#[path = "../fuzz/src/seeds.rs"]
mod seeds;

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn file_stems(dir: &Path, extension: Option<&str>) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| extension.is_none_or(|ext| path.extension().is_some_and(|e| e == ext)))
        .map(|path| {
            path.file_stem()
                .expect("a file name")
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// Every saved input of every target, run through its body: none may panic. Fails when a
/// target's corpus is missing or empty, so it cannot pass by replaying nothing.
#[test]
fn every_target_replays_its_saved_corpus() {
    let mut failures = Vec::new();
    let mut replayed = 0;
    for target in bodies::TARGETS {
        let dir = fuzz_dir().join("corpus").join(target.name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| {
                panic!(
                    "corpus of {} missing at {}: {e}",
                    target.name,
                    dir.display()
                )
            })
            .map(|entry| entry.expect("a directory entry").path())
            .collect();
        files.sort();
        assert!(
            !files.is_empty(),
            "corpus of {} at {} is empty",
            target.name,
            dir.display()
        );
        for file in files {
            let data = std::fs::read(&file).expect("a readable corpus file");
            if catch_unwind(AssertUnwindSafe(|| (target.run)(&data))).is_err() {
                failures.push(file.display().to_string());
            }
            replayed += 1;
        }
    }
    assert!(failures.is_empty(), "inputs that panicked: {failures:#?}");
    assert!(replayed >= bodies::TARGETS.len());
}

/// The targets listed in `bodies::TARGETS`, the libFuzzer binaries and the corpus directories are
/// the same set: a target added in one place only fails here.
#[test]
fn every_target_has_a_binary_and_a_corpus() {
    let listed: BTreeSet<String> = bodies::TARGETS.iter().map(|t| t.name.to_owned()).collect();
    assert_eq!(
        listed.len(),
        bodies::TARGETS.len(),
        "duplicate target names"
    );
    assert_eq!(
        file_stems(&fuzz_dir().join("fuzz_targets"), Some("rs")),
        listed
    );
    assert_eq!(file_stems(&fuzz_dir().join("corpus"), None), listed);
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for name in &listed {
        assert!(
            manifest.contains(&format!("path = \"fuzz_targets/{name}.rs\"")),
            "fuzz/Cargo.toml has no [[bin]] for {name}"
        );
    }
}

/// Each seed gives the outcome it was made for: the valid messages are accepted (so the
/// encoders and decoders agree) and each hand-made edge case is refused.
#[test]
fn seeds_give_their_expected_outcome() {
    let seeds = seeds::all();
    for target in bodies::TARGETS {
        assert!(
            seeds.iter().any(|s| s.target == target.name),
            "no seeds for {}",
            target.name
        );
    }
    for seed in &seeds {
        let target = bodies::target(seed.target).expect("a seed names a known target");
        assert_eq!(
            (target.run)(&seed.bytes),
            seed.expect,
            "seed {}/{}",
            seed.target,
            seed.name
        );
    }
}

/// Writes every seed to `fuzz/corpus/<target>/seed-<name>`. Run after changing a message or
/// adding a target: `cargo test --test fuzz_corpus -- --ignored write_seed_corpus`.
#[test]
#[ignore = "writes into the source tree; run by hand to refresh the seeds"]
fn write_seed_corpus() {
    for seed in seeds::all() {
        let dir = fuzz_dir().join("corpus").join(seed.target);
        std::fs::create_dir_all(&dir).expect("a corpus directory");
        std::fs::write(dir.join(format!("seed-{}", seed.name)), &seed.bytes)
            .expect("a written seed");
    }
}
