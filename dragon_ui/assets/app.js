() => {
  // Accessible names and descriptions for gradio's fields, kept as components come and go (tabs open, rows show).
  // gradio puts a field's help (its info) inside the field's <label>, so a screen reader read the help as part of
  // the name ("Prompt A column, or a template…") and a search by label found nothing: the name becomes the label
  // alone (aria-labelledby) and the help its description (aria-describedby). A field that names itself (gradio's
  // dropdowns and sliders set aria-label) keeps its name and gets the description. A group of radio buttons or
  // checkboxes is a <fieldset> without a legend: the group takes the name and the description, each option keeps
  // its own label.
  // gradio's empty-value box (an empty plot, file or code view) is a plain div with an aria-label, which no role
  // allows: as an image its label is its name.
  let made = 0;
  const idOf = (element, kind) => element.id || (element.id = `dragon-${kind}-${++made}`);
  const CONTROLS = 'textarea, input:not([type=hidden]):not([type=file]), select';
  const label = () => {
    const blocks = new Set([...document.querySelectorAll('.block [data-testid="block-info"], .block .info-text')]
      .map((element) => element.closest('.block')));
    for (const block of blocks) {
      const own = (selector) => [...block.querySelectorAll(selector)].find((e) => e.closest('.block') === block);
      const name = own('[data-testid="block-info"]'), help = own('.info-text');
      const group = block.tagName === 'FIELDSET';
      const controls = group ? [block] : [...block.querySelectorAll(CONTROLS)].filter((c) => c.closest('.block') === block);
      for (const control of controls) {
        const option = control.type === 'checkbox' || control.type === 'radio';  // named by its own label
        if (name && !option && !control.hasAttribute('aria-label') && !control.hasAttribute('aria-labelledby')) {
          control.setAttribute('aria-labelledby', idOf(name, 'name'));
        }
        if (help && !control.hasAttribute('aria-describedby')) {
          control.setAttribute('aria-describedby', idOf(help, 'help'));
        }
      }
    }
    for (const box of document.querySelectorAll('.empty[aria-label]:not([role])')) box.setAttribute('role', 'img');
  };
  let pending = false;
  new MutationObserver(() => {
    if (!pending) {
      pending = true;
      requestAnimationFrame(() => { pending = false; label(); });
    }
  }).observe(document.body, {childList: true, subtree: true});
  label();
}
