//! libFuzzer target `rules_yaml`: see `floodgate_fuzz::bodies::rules_yaml` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::rules_yaml(data);
});
