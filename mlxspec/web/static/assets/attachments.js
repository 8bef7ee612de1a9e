// Images for the next prompt (a vision model, ready.vision): pasted into the
// message box, dropped on the composer or picked with the image button, shown
// as thumbnails above the box until sent as prompt.images [{data, mimeType}]
// (data: the file's base64, as the reference's frame carries it).

/** The most image bytes one prompt carries (the server reads frames of up to 8 MiB). */
export const MAX_BYTES = 5 * 2 ** 20;

const readBase64 = (file) =>
  new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ""));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });

/** An image's data URL for an <img> (never fetched from elsewhere: the page's own bytes). */
export const imageUrl = (image) => `data:${image.mimeType};base64,${image.data}`;

/**
 * Wire the composer's image controls.
 *
 * @param {object} parts - {composer, box, tray, pick, input, notice, enabled}: the form,
 *   the message box, the thumbnail tray, the image button, its file input, a notice
 *   callback and a function saying whether the model takes images.
 * @returns {{take: () => object[], pending: () => boolean, restore: (images: object[]) => void,
 *   show: (on: boolean) => void}}
 */
export function wireAttachments({ composer, box, tray, pick, input, notice, enabled }) {
  let images = [];

  function render() {
    tray.replaceChildren();
    images.forEach((image, i) => {
      const item = document.createElement("figure");
      item.className = "attachment";
      const img = document.createElement("img");
      img.src = imageUrl(image);
      img.alt = image.name || `image ${i + 1}`;
      const drop = document.createElement("button");
      drop.type = "button";
      drop.className = "icon";
      drop.textContent = "×";
      drop.setAttribute("aria-label", `Remove ${img.alt}`);
      drop.addEventListener("click", () => {
        images.splice(i, 1);
        render();
      });
      item.append(img, drop);
      tray.append(item);
    });
    tray.hidden = !images.length;
  }

  async function add(files) {
    const wanted = [...files].filter((f) => f.type.startsWith("image/"));
    if (!wanted.length) return;
    if (!enabled()) {
      notice("This model takes no images.");
      return;
    }
    let total = images.reduce((n, image) => n + image.data.length, 0);
    for (const file of wanted) {
      const data = await readBase64(file);
      if (total + data.length > MAX_BYTES) {
        notice(`Images over ${MAX_BYTES / 2 ** 20} MB in one message are not sent: ${file.name || "the pasted image"} left out.`);
        continue;
      }
      total += data.length;
      images.push({ data, mimeType: file.type, name: file.name });
    }
    render();
    box.focus();
  }

  box.addEventListener("paste", (event) => {
    const files = [...(event.clipboardData?.items || [])]
      .filter((item) => item.kind === "file" && item.type.startsWith("image/"))
      .map((item) => item.getAsFile());
    if (!files.length) return;
    event.preventDefault();
    add(files);
  });
  composer.addEventListener("dragover", (event) => {
    if (![...(event.dataTransfer?.types || [])].includes("Files")) return;
    event.preventDefault();
    composer.classList.add("dropping");
  });
  composer.addEventListener("dragleave", () => composer.classList.remove("dropping"));
  composer.addEventListener("drop", (event) => {
    composer.classList.remove("dropping");
    if (!event.dataTransfer?.files?.length) return;
    event.preventDefault();
    add(event.dataTransfer.files);
  });
  pick.addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    add(input.files);
    input.value = "";
  });

  return {
    /** The images to send (without their names), emptying the tray. */
    take() {
      const out = images.map(({ data, mimeType }) => ({ data, mimeType }));
      images = [];
      render();
      return out;
    },
    /** Whether images wait to be sent. */
    pending: () => images.length > 0,
    /** Put refused images back, unless new ones were added since. */
    restore(back) {
      if (images.length || !back?.length) return;
      images = back.map((image) => ({ ...image }));
      render();
    },
    /** Show the image button (ready.vision); a model without vision drops the tray. */
    show(on) {
      pick.hidden = !on;
      if (!on) {
        images = [];
        render();
      }
    },
  };
}
