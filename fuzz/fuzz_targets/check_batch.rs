//! libFuzzer target `check_batch`: see `floodgate_fuzz::bodies::check_batch` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::check_batch(data);
});
