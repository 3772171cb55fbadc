//! `ork-route --ram`, the board planner's command (`src/bin/ork-route/board.rs`, whose unit tests
//! check its plans' values), run as a child process.

/// `board::tests::a_model_bigger_than_ram_does_not_fit` through the binary (a child process:
/// skipped under qemu, `tests/cross/test.sh`).
#[test]
fn ork_route_says_a_model_bigger_than_ram_does_not_fit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ork-route")).args(["--model", "Llama-3.1-70B", "--quant", "Q8_0", "--ram", "32"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("DOES NOT FIT"), "{text}");
    // Its first line says the figures are modelled and what they assume.
    assert!(text.starts_with("# modelled, not measured: RK3588 NPU") && text.lines().next().unwrap().contains("A76_OVER_HERE = 2.5"), "{text}");
}
