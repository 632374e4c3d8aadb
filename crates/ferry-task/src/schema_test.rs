//! One macro for every crate's schema test: the committed `schemas/<Type>.avsc` of each
//! record type equals the schema derived from the Rust type (`FERRY_BLESS=1` rewrites the
//! file) and stays compatible with its last committed version, and the type is
//! registered (in [`crate::wire::PROTOCOL`] or a kind's [`crate::kind::KindInfo`]).

/// Expands to a `#[test]` checking the committed schemas of the record types named (bare
/// type names in scope; the file is `schemas/<Type>.avsc` at the workspace root).
///
/// ```ignore
/// use ferry_peer::spec::PeerClusters;
/// ferry_task::committed_schemas!(PeerClusters);
/// ```
#[macro_export]
macro_rules! committed_schemas {
    ($($ty:ident),+ $(,)?) => {
        #[test]
        fn committed_schemas_equal_the_rust_types() {
            let dir = ::std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
            let derived = [$((concat!(stringify!($ty), ".avsc"), <$ty as $crate::__avro::AvroSchema>::get_schema())),+];
            if let Err(problems) = $crate::wire::check_committed(&dir, &derived) {
                panic!("{}", problems.join("\n"));
            }
        }
    };
}
