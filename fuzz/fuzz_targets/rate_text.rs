//! libFuzzer target `rate_text`: see `floodgate_fuzz::bodies::rate_text` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::rate_text(data);
});
