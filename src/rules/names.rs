//! apimachinery's name and version string checks, with upstream's exact messages (spec §2.6).
