//! libFuzzer target `snapshot_merge`: see `floodgate_fuzz::bodies::snapshot_merge` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::snapshot_merge(data);
});
