// The scheduling HAL: the service relays priorities, the driver reports work.
package android.hardware.npu;

import android.hardware.npu.ISchedulingCallback;
import android.hardware.npu.SchedulingConfig;

@VintfStability
interface IScheduling {
    const int MIN_PRIORITY = 0;
    const int MAX_PRIORITY = 1000;

    // Replaces the whole set; an empty array clears it. A priority outside
    // MIN_PRIORITY..MAX_PRIORITY or two configs for one uid is an illegal argument.
    void setSchedulingConfigs(in SchedulingConfig[] configs);

    // Inserts or replaces the config of each uid given, with the same validation.
    void updateSchedulingConfigs(in SchedulingConfig[] configs);

    // Holds one callback; null clears it. Events are debounced over the window.
    void setCallback(in @nullable ISchedulingCallback callback, int debounceDurationMs);
}
