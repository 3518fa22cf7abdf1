//! libFuzzer target `snapshot`: see `floodgate_fuzz::bodies::snapshot` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::snapshot(data);
});
