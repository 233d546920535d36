"""The report's figures as pure functions: long DataFrame (losses already renamed to display
names) in, one PNG written atomically out. One module per report section that draws figures;
:mod:`.style` holds what they share. Matplotlib draws off-screen (Agg) here."""

import matplotlib

matplotlib.use("Agg")
