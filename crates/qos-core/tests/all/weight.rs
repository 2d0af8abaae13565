//! The weight scale and its conversions: exhaustively over 1..=1000, by proptest over every integer input.

use proptest::prelude::*;
use qos_core::{Weight, WeightError};

fn all_weights() -> impl Iterator<Item = Weight> {
    (1..=1000).map(|v| Weight::new(v).expect("in range"))
}

#[test]
fn the_whole_range_is_valid_and_nothing_else() {
    assert_eq!(all_weights().count(), 1000);
    assert_eq!(Weight::MIN.get(), 1);
    assert_eq!(Weight::MAX.get(), 1000);
    assert_eq!(Weight::KERNEL_DEFAULT.get(), 100);
    for bad in [0, 1001, u64::from(u16::MAX) + 1, u64::MAX] {
        assert_eq!(Weight::new(bad), Err(WeightError::OutOfRange { value: bad, min: 1, max: 1000 }));
        assert!(Weight::new(bad).unwrap_err().to_string().contains(&bad.to_string()));
    }
}

#[test]
fn conversions_are_monotone_in_range_and_round_trip() {
    let mut prev: Option<Weight> = None;
    for weight in all_weights() {
        let v = weight.get();
        assert_eq!(weight.to_string(), v.to_string());
        assert_eq!(weight.to_bfq(), v, "BFQ files take the engine's scale as is");
        assert!((10..=1000).contains(&weight.to_v1_blkio_weight()));
        assert!((10..=1000).contains(&weight.to_docker()));
        assert!((1..=10_000).contains(&weight.to_io_weight()));
        assert_eq!(u32::from(weight.to_docker()), weight.to_v1_blkio_weight());
        assert_eq!(weight.to_v1_blkio_weight(), v.max(10));
        assert_eq!(Weight::from_io_weight(weight.to_io_weight()), Ok(weight), "round trip through io.weight");
        if let Some(p) = prev {
            assert!(p < weight);
            assert!(p.to_bfq() < weight.to_bfq());
            assert!(p.to_io_weight() < weight.to_io_weight(), "io.weight keeps every distinction");
            assert!(p.to_v1_blkio_weight() <= weight.to_v1_blkio_weight());
            assert!(p.to_docker() <= weight.to_docker());
        }
        prev = Some(weight);
    }
}

#[test]
fn io_weight_ratio_is_kept() {
    // 1000:10 stays 100:1 in io.weight (a linear range map would make it 10000:1).
    let top = Weight::MAX.to_io_weight();
    let bottom = Weight::new(10).unwrap().to_io_weight();
    assert_eq!(top / bottom, 100);
    assert_eq!(Weight::KERNEL_DEFAULT.to_io_weight(), 100);
}

#[test]
fn io_weight_outside_its_range_is_rejected() {
    for bad in [0, 10_001, u32::MAX] {
        assert_eq!(
            Weight::from_io_weight(bad),
            Err(WeightError::OutOfRange { value: bad.into(), min: 1, max: 10_000 })
        );
    }
    assert_eq!(Weight::from_io_weight(10_000), Ok(Weight::MAX));
    assert_eq!(Weight::from_io_weight(1001), Ok(Weight::MAX));
}

#[test]
fn weights_deserialize_checked() {
    #[derive(serde::Deserialize, Debug)]
    struct W {
        w: Weight,
    }
    assert_eq!(toml::from_str::<W>("w = 1000").unwrap().w, Weight::MAX);
    for bad in ["w = 0", "w = 1001", "w = -1", "w = \"100\""] {
        assert!(toml::from_str::<W>(bad).is_err(), "{bad}");
    }
}

proptest! {
    #[test]
    fn new_accepts_exactly_1_to_1000(v in any::<u64>()) {
        match Weight::new(v) {
            Ok(w) => prop_assert!((1..=1000).contains(&v) && u64::from(w.get()) == v),
            Err(_) => prop_assert!(!(1..=1000).contains(&v)),
        }
    }

    #[test]
    fn from_io_weight_is_monotone_and_clamped(a in any::<u32>(), b in any::<u32>()) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        match (Weight::from_io_weight(lo), Weight::from_io_weight(hi)) {
            (Ok(x), Ok(y)) => {
                prop_assert!(x <= y);
                prop_assert_eq!(x.get(), lo.min(1000));
            }
            (x, y) => {
                prop_assert_eq!(x.is_ok(), (1..=10_000).contains(&lo));
                prop_assert_eq!(y.is_ok(), (1..=10_000).contains(&hi));
            }
        }
    }

    #[test]
    fn conversions_preserve_order(a in 1u64..=1000, b in 1u64..=1000) {
        let (x, y) = (Weight::new(a).unwrap(), Weight::new(b).unwrap());
        prop_assert_eq!(x.cmp(&y), a.cmp(&b));
        prop_assert_eq!(x.to_io_weight().cmp(&y.to_io_weight()), a.cmp(&b));
        if a <= b {
            prop_assert!(x.to_docker() <= y.to_docker());
            prop_assert!(x.to_v1_blkio_weight() <= y.to_v1_blkio_weight());
        }
    }
}
