//! Each crash or hang the fuzz targets found, as the smallest input that showed it (named
//! after what it was), so it stays fixed.
