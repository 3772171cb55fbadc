//! How late a sleeping thread wakes on this machine: the overshoot of `std::thread::sleep` for
//! the submit lengths of the timed simulator (`ORK_SIM_TIMING=board`), with the 1 µs timer slack
//! the simulator sets, and of sleeping to 60 µs before the end then polling the clock (what the
//! simulator does, `npu::kif::sim`). Median and 90th percentile of 400 sleeps each.
//!
//!   cargo run --release --example sleep_lateness
use std::time::{Duration, Instant};

fn main() {
    let _ = nix::sys::prctl::set_timerslack(1_000);
    for us in [200u64, 1600] {
        let d = Duration::from_micros(us);
        for poll in [None, Some(Duration::from_micros(60))] {
            let mut late: Vec<f64> = (0..400)
                .map(|_| {
                    let t = Instant::now();
                    let end = t + d;
                    match poll {
                        None => std::thread::sleep(d),
                        Some(p) => {
                            std::thread::sleep(d.saturating_sub(p));
                            while Instant::now() < end {
                                std::thread::yield_now();
                            }
                        }
                    }
                    (t.elapsed().as_secs_f64() - d.as_secs_f64()) * 1e6
                })
                .collect();
            late.sort_by(f64::total_cmp);
            let how = if poll.is_some() { "sleep to 60 µs before, then poll" } else { "sleep" };
            println!("{us} µs, {how}: late by {:.1} µs median, {:.1} µs p90", late[late.len() / 2], late[late.len() * 9 / 10]);
        }
    }
}
