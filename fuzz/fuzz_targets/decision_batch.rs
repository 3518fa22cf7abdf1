//! libFuzzer target `decision_batch`: see `floodgate_fuzz::bodies::decision_batch` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::decision_batch(data);
});
