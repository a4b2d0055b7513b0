//! `hold_first_free`: the first free key of a list, in one round trip, kept as `hold` keeps a lease
//! (clients/behaviours/keeping.json's the_first_free_key_of_a_list, run here by hand until the
//! keeping runner runs that file).
mod common;
use common::{cluster, config, plain, run};
use pg_fence_client::{hold_first_free, lease, AcquireOptions, KeepOptions};
use std::time::{Duration, Instant};

#[test]
fn the_first_free_key_of_a_list_is_held_and_kept() {
    let cluster = cluster("rc_first_free", 27633);
    let port = cluster.port();
    run(async {
        let admin = plain(port).await;
        let hour = AcquireOptions::new(Duration::from_secs(3600)).owner("other");
        for index in [0, 1] {
            lease::acquire(&admin, &format!("ff-{index}"), &hour).await.unwrap().unwrap();
        }
        let keys: Vec<String> = (0..4).map(|index| format!("ff-{index}")).collect();
        let opts = AcquireOptions::new(Duration::from_secs(2)).owner("w");
        let held = hold_first_free(config(port, "rc_first_free"), &keys, &opts, KeepOptions::default())
            .await
            .unwrap()
            .expect("ff-2 is free");
        assert_eq!(held.lease().key, "ff-2");
        // Kept past its TTL.
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            assert!(held.is_held(), "{:?}", held.state());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let three = &keys[..3];
        let none = hold_first_free(config(port, "rc_first_free"), three, &opts, KeepOptions::default());
        assert!(none.await.unwrap().is_none(), "none of the first three is free");
        let bound_opts = opts.clone().session_bound(true);
        let bound = hold_first_free(config(port, "x"), three, &bound_opts, KeepOptions::default());
        assert!(bound.await.is_err());
        assert!(held.release().await.unwrap());
    });
}
