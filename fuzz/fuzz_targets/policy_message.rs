//! libFuzzer target `policy_message`: see `floodgate_fuzz::bodies::policy_message` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    floodgate_fuzz::bodies::policy_message(data);
});
