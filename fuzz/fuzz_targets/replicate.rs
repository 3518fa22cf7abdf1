//! libFuzzer target `replicate`: see `floodgate_fuzz::bodies::replicate` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::replicate(data);
});
