//! The plan's steps: one kind, [`child::ChildStep`], one per child command.

pub mod child;
