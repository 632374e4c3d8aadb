//! The score task's steps, one module each, in plan order: [`resolve`]
//! (`resolve-clusters`), [`measure`], [`score`], [`publish`]. The benchmark's ManifestWorks,
//! which `measure` runs and its undo removes, are in [`crate::benchmark`].

pub mod measure;
pub mod publish;
pub mod resolve;
pub mod score;
