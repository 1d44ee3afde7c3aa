use fraglink::fragment::StaticFragment;
use fraglink::fragments::{Cosine, FilterFragment, MetricFragment, NoneFilter, ScanFragment, F32, I64, I8, U32};

fn main() {
    assert_eq!(<ScanFragment<F32, U32, 4, 128>>::info().name, "scan_f32_u32_v4_k128");
    assert_eq!(<MetricFragment<Cosine, I8>>::info().name, "metric_cosine_i8");
    assert_eq!(<FilterFragment<NoneFilter, I64>>::info().name, "filter_none_i64");
}
