template <int N, bool BF16> EMBER_D void ember_wgmma_s(float* d, unsigned long long da, unsigned long long db, int acc);
template <int N, bool BF16> EMBER_D void ember_wgmma_pv(float* d, const unsigned* a, unsigned long long db);
