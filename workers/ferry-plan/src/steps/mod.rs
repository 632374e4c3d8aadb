//! The plan's steps: one child ([`child`]), or a step fanned out over clusters: its
//! choice of clusters ([`select`]) and its children in waves ([`waves`]).

pub mod child;
pub mod select;
pub mod waves;
