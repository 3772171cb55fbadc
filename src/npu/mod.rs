//! NPU core (mechanism). Placeholder: the real module lands with the NPU core work.
pub mod detect;
pub mod hostcpu;
pub mod kif;
pub mod soc;
