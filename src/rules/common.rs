//! Recomputing `commonEncodingVersion` and the `AllEncodingVersionsEqual` condition exactly as
//! upstream's `SetCommonEncodingVersion` (spec §3.3).
