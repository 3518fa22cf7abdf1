//! libFuzzer target `replicate_merge`: see `floodgate_fuzz::bodies::replicate_merge` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::replicate_merge(data);
});
