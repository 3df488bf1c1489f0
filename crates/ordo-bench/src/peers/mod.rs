//! The peers measured in the same run as Ordo (see `SCENARIOS.md`).
//!
//! Each peer module exposes one function per scenario with the same
//! signature as the matching function of [`crate::ordo_system`] (the naive
//! module takes an extra [`naive::Mode`]).

pub mod eyeball;
pub mod naive;
