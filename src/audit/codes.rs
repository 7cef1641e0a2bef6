//! The codes of what `audit` and `serve --report` find besides admission-rule violations: the
//! state of storage migrations, of built-in resources and of CRDs. Declared once here; `rules`
//! lists them after the admission rules (and the README's second table is made from that), the
//! report names them as its `rule`, `audit --output json` as `code`.

use std::fmt;

use serde::Serialize;

macro_rules! finding_codes {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal, $description:literal; )*) => {
        /// Stable finding codes (kebab-case), part of our interface like [`crate::rules::Code`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum FindingCode {
            $( $(#[$doc])* $variant, )*
        }

        impl FindingCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [FindingCode] = &[ $( FindingCode::$variant, )* ];

            pub fn as_str(self) -> &'static str {
                match self { $( FindingCode::$variant => $code, )* }
            }

            /// What the finding says, in one line (Markdown: code spans in backticks).
            pub fn description(self) -> &'static str {
                match self { $( FindingCode::$variant => $description, )* }
            }
        }
    };
}

finding_codes! {
    /// A built-in resource whose objects may still be stored in another version.
    StaleStorage = "stale-storage",
        "a built-in resource's objects may still be stored in a version other than the one every apiserver encodes, and no migration begun since has succeeded";
    /// A CRD's storedVersions lists a version besides its storage version and no migration of
    /// ours covers it.
    CrdStoredVersions = "crd-stored-versions",
        "a CRD's `status.storedVersions` lists a version besides its storage version, and no migration covers it yet";
    /// Our migration of a CRD is running.
    CrdMigrationRunning = "crd-migration-running",
        "our migration of the CRD's objects is running; `storedVersions` is pruned when it succeeds";
    /// Our migration of a CRD failed for this very need.
    CrdMigrationFailed = "crd-migration-failed",
        "our migration of the CRD's objects failed; `storedVersions` is left alone, and the leader tries again after `--crd-migrate-retry` (doubling)";
    /// Our migration of a CRD succeeded and storedVersions is still to be pruned.
    CrdPrunePending = "crd-prune-pending",
        "our migration succeeded and `storedVersions` is still to be set to the storage version (by us, or by kube-controller-manager after a StorageVersionMigration)";
}

impl Serialize for FindingCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl fmt::Display for FindingCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
