//! libFuzzer target `check_batch_decide`: see `floodgate_fuzz::bodies::check_batch_decide` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::check_batch_decide(data);
});
