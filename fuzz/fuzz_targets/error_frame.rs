//! libFuzzer target `error_frame`: see `floodgate_fuzz::bodies::error_frame` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::error_frame(data);
});
