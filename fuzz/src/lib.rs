//! floodgate's fuzz targets as plain functions ([`bodies`]) and their seed inputs ([`seeds`]):
//! the libFuzzer binaries in `fuzz_targets/` call the bodies, and the core's
//! `tests/fuzz_corpus.rs` compiles these same two files to replay the saved corpora on stable.

pub mod bodies;
pub mod seeds;
