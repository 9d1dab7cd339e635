// The scheduling parameters of one uid, relayed by the service to the driver.
package android.hardware.npu;

@VintfStability
parcelable SchedulingConfig {
    // A job priority is clamped into [minPriority, maxPriority] before use.
    int minPriority;
    int maxPriority;
    int uid;
    // The uid's own priority, 0 (most important) to 1000.
    int appPriority;
    boolean hasDirectAccess;
    boolean canAttributeOtherUid;
}
